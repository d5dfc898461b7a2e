"""`marconi models`: the cost-model presets with their per-token KV and per-checkpoint state bytes."""

from __future__ import annotations

import json

import click

from sim.cost import MODELS


def _rows() -> list[dict]:
    rows = []
    for spec in MODELS.values():
        rows.append(
            {
                "name": spec.name,
                "layers": spec.layers_by_type(),
                "is_hybrid": spec.is_hybrid,
                "kv_bytes_per_token": spec.kv_bytes_per_token(),
                "state_bytes": spec.state_bytes(),
                "state_kv_tokens": round(spec.state_kv_tokens(), 1) if spec.is_hybrid else 0.0,
                "flops_per_token_1k": spec.flops(1024) / 1024,
                "active_params": spec.active_params(),
            }
        )
    return rows


def _layers_text(layers: dict[str, int]) -> str:
    short = {"attention": "attn", "gated_delta": "gdn", "mamba2": "mamba2", "mlp": "mlp"}
    return " + ".join(f"{n} {short[k]}" for k, n in layers.items() if n)


def register(main: click.Group) -> None:
    @main.command("models")
    @click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
    def models(fmt: str) -> None:
        """List model presets: layers by type, KV bytes per token, state bytes per checkpoint."""
        rows = _rows()
        if fmt == "json":
            click.echo(json.dumps(rows, indent=2))
            return
        head = ("model", "layers", "KV B/token", "state B/ckpt", "state = KV of N tok", "FLOPs/token @1K")
        body = [
            (
                r["name"],
                _layers_text(r["layers"]),
                f"{r['kv_bytes_per_token']:,}",
                f"{r['state_bytes']:,}",
                f"{r['state_kv_tokens']:,.0f}" if r["is_hybrid"] else "-",
                f"{r['flops_per_token_1k']:.3g}",
            )
            for r in rows
        ]
        widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
        for j, line in enumerate([head, *body]):
            click.echo(
                "  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
            )
            if j == 0:
                click.echo("  ".join("-" * w for w in widths))

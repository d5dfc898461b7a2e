"""`marconi models [CONFIG...]`: the cost-model presets (or the models read from Hugging Face
config.json files) with their per-token KV and per-checkpoint state bytes."""

from __future__ import annotations

import json

import click

from sim.cli.options import format_option
from sim.cost import MODELS, get_model


def _rows(names=()) -> list[dict]:
    rows = []
    given: dict = {}  # `marconi models A A`: A once, in the order given
    for n in names:
        spec = get_model(n)
        given.setdefault(spec.name, spec)
    for spec in given.values() if names else MODELS.values():
        rows.append(
            {
                "name": spec.name,
                "layers": spec.layers_by_type(),
                "is_hybrid": spec.is_hybrid,
                "kv_bytes_per_token": spec.kv_bytes_per_token(),
                "state_bytes": spec.state_bytes(),
                # a model without attention (Mamba2 alone) has no KV to weigh a state against: null
                "state_kv_tokens": (round(spec.state_kv_tokens(), 1) if spec.kv_bytes_per_token() else None)
                if spec.is_hybrid
                else 0.0,
                "flops_per_token_1k": spec.flops(1024) / 1024,
                "active_params": spec.active_params(),
                # where the engines serve it in another dtype than its checkpoint's (an fp32
                # config.json: "fp32 checkpoint served in bf16"), null elsewhere
                "note": spec.dtype_note or None,
                # where the state's dtype is the engines' default, not the config's (Nemotron-H: fp32)
                "state_note": spec.state_note or None,
            }
        )
    return rows


def _layers_text(layers: dict[str, int]) -> str:
    short = {"attention": "attn", "gated_delta": "gdn", "mamba1": "mamba1", "mamba2": "mamba2", "mlp": "mlp"}
    return " + ".join(f"{n} {short[k]}" for k, n in layers.items() if n)


def register(main: click.Group) -> None:
    @main.command("models")
    @click.argument("configs", nargs=-1)
    @format_option("table: a row per model; json: every figure of each model (layers, bytes, FLOPs, parameters).")
    def models(configs, fmt: str) -> None:
        """List model presets: layers by type, KV bytes per token, state bytes per checkpoint.

        CONFIGS: preset names, or Hugging Face config.json files (or folders holding one) to read
        as `--model PATH` reads them (docs/models.md); their rows alone are printed."""
        rows = _rows(configs)
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
                f"{r['state_kv_tokens']:,.0f}" if r["is_hybrid"] and r["state_kv_tokens"] is not None else "-",
                f"{r['flops_per_token_1k']:.2e}",  # three digits in every row (.3g gave 1.4e+10 beside 1.32e+10)
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
        for r in rows:  # what the row's bytes assume, where it is not the checkpoint's own dtype
            if r["note"]:
                click.echo(f"note: {r['name']}: {r['note']} (vLLM's and SGLang's --dtype auto; docs/models.md)")
            if r["state_note"]:
                click.echo(f"note: {r['name']}: {r['state_note']} (docs/models.md)")

"""`marconi plot`: figures (PNG and SVG) from a `marconi sweep` results folder."""

from __future__ import annotations

import math
from pathlib import Path

import click

from sim.analysis.plot import KINDS, NotInRows, make_figure, pyplot, save_to
from sim.cli.outdir import OutputPath, check_output_files, output_folder, written_together
from sim.errors import UsageError
from sim.experiments.store import NoRecords


def _figure(results, kind, where, static):
    if kind == "replay":  # measured vs modelled prefill time of a `marconi replay --out` folder
        from sim.replay import output  # noqa: PLC0415

        _, summary, requests = output.load(results)
        return output.fig_replay(requests, summary)
    return make_figure(results, kind, where, static)


def register(main: click.Group) -> None:
    @main.command("plot")
    @click.argument("results", type=click.Path(exists=True, file_okay=False, path_type=Path))
    @click.option(
        "--kind",
        "kinds",
        type=click.Choice(KINDS + ("all", "replay")),
        multiple=True,
        default=("hit-rate",),
        show_default=True,
        help="Figure(s) to draw (repeat the flag, or all); replay: RESULTS is a `marconi replay --out` folder.",
    )
    @click.option(
        "--out",
        type=OutputPath(file_okay=False, path_type=Path),
        default=Path("figures"),
        show_default=True,
        help="Folder the figures are written to (KIND.png and KIND.svg).",
    )
    @click.option(
        "--where",
        default=None,
        help="Row filter: KEY=VALUE as `marconi report` takes it (capacity=2GB, policy=marconi), or a pandas "
        "query: \"capacity_bytes == 5e9 and trace == 'sharegpt'\".",
    )
    @click.option(
        "--alpha",
        "static",
        default="best",
        show_default=True,
        help="Static-alpha grids: best (best alpha in hindsight per configuration), all, or one value.",
    )
    @click.option("--force", is_flag=True, help="Replace figures of the same names in --out.")
    def plot_cmd(results, kinds, out, where, static, force):
        """Draw figures (PNG and SVG) from a `marconi sweep` results folder (needs matplotlib:
        pip install 'marconi-sim[notebooks]')."""
        try:
            import matplotlib  # noqa: PLC0415 - optional heavy extra, loaded only when drawing
        except ImportError:
            raise UsageError("marconi plot needs matplotlib: pip install 'marconi-sim[notebooks]'") from None

        matplotlib.use("Agg")
        plt = pyplot()
        if static not in ("best", "all"):
            try:
                value = float(static)
            except ValueError:
                value = math.nan
            if not 0 <= value < math.inf:  # NaN fails both comparisons
                raise UsageError(f"--alpha must be best, all or a finite number >= 0, not {static!r}") from None
            static = value
        todo = KINDS if "all" in kinds else tuple(dict.fromkeys(kinds))
        with output_folder(out):  # created (or refused) before the results are read
            # the figures' files: never an existing one without --force (nor a file of the package)
            files = {out / f"{kind}.{fmt}": "--out" for kind in todo for fmt in ("png", "svg")}
            check_output_files(files, force=force, inputs=[])
            undrawn, drawn = [], []
            # the figures as one set, renamed into place when the last is drawn: an interrupted plot
            # leaves none of them (its rerun refused the ones drawn before as existing files)
            with written_together() as put:
                for kind in todo:
                    try:
                        fig = _figure(results, kind, where, static)
                    except NoRecords as exc:
                        if "all" not in kinds:
                            raise
                        # --kind all: every figure the folder has the records of
                        why = str(exc)
                        if why.startswith("no "):  # none at all (else some configurations' are missing)
                            why = f"{results} has no per-request records (rerun the sweep with --save-requests)"
                        undrawn.append((kind, why))
                        continue
                    except NotInRows as exc:  # --kind all: the rows hold nothing this figure draws
                        if "all" not in kinds:
                            raise
                        click.echo(f"note: {kind} not drawn: {exc}", err=True)
                        continue
                    for fmt in ("png", "svg"):
                        put(out / f"{kind}.{fmt}", lambda tmp, fig=fig, fmt=fmt: save_to(fig, tmp, fmt))
                        drawn.append(out / f"{kind}.{fmt}")
                    plt.close(fig)
            for p in drawn:
                click.echo(str(p))
            for why in dict.fromkeys(w for _, w in undrawn):
                click.echo(f"note: {', '.join(k for k, w in undrawn if w == why)} not drawn: {why}", err=True)

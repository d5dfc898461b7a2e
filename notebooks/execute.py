"""Execute the notebooks and keep their outputs: ``python notebooks/execute.py [NAME ...] [--out DIR]``.

Each notebook runs top to bottom in a fresh kernel whose working folder is ``notebooks/`` (as
Jupyter runs it), through nbclient (the ``notebooks`` extra), and is written back with its outputs
(into ``--out DIR`` instead, when given; the committed copies were written this way). Without a
results folder each notebook runs its own small sweep (about a minute or less); ``RESULTS_DIR``,
``REPLAY_DIR`` and ``ADVISE_DIR`` name folders to read instead, relative to where this is run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV_FOLDERS = ("RESULTS_DIR", "REPLAY_DIR", "ADVISE_DIR", "SMALL_SWEEP_DIR")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebooks to run (default: all), e.g. hit_rates")
    parser.add_argument("--out", type=Path, default=None, help="write the executed notebooks here, not in place")
    parser.add_argument("--timeout", type=int, default=600, help="seconds a cell may run")
    args = parser.parse_args(argv)
    try:
        import nbclient  # noqa: PLC0415 - the notebooks extra
        import nbformat  # noqa: PLC0415
    except ImportError:
        print("notebooks need nbclient: pip install 'marconi-sim[notebooks]'", file=sys.stderr)
        return 2
    known = sorted(p.stem for p in HERE.glob("*.ipynb"))
    names = args.names or known
    unknown = [n.removesuffix(".ipynb") for n in names if n.removesuffix(".ipynb") not in known]
    if unknown:
        print(f"no notebook {', '.join(unknown)} in {HERE} (there are: {', '.join(known)})", file=sys.stderr)
        return 2
    for key in ENV_FOLDERS:  # the kernel runs in notebooks/: folders named from here, made absolute
        if os.environ.get(key):
            os.environ[key] = str(Path(os.environ[key]).resolve())
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    for name in (n.removesuffix(".ipynb") for n in names):
        src = HERE / f"{name}.ipynb"
        nb = nbformat.read(src, as_version=4)
        start = time.perf_counter()
        client = nbclient.NotebookClient(
            nb, timeout=args.timeout, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}
        )
        try:
            client.execute()
        except nbclient.exceptions.CellExecutionError as exc:
            print(f"{name}: a cell failed: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
            return 1
        dest = (args.out or HERE) / f"{name}.ipynb"
        tmp = dest.with_name(f".tmp-{dest.name}")
        nbformat.write(nb, tmp)
        tmp.replace(dest)  # renamed when complete: never a half-written notebook
        print(f"{name}: {time.perf_counter() - start:.0f} s -> {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

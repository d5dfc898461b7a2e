"""benchmarks/mutation.py with kernels/ssd.py's sites limited to one side: ``host`` (its host-side
functions, ``HOST``: the launcher and its configuration) or ``kernel`` (every other function, the
Triton kernels, whose OVL branches never run in the interpreter).

    python ssd_sites.py host|kernel MUTATION-ARGS...
"""

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import mutation as M  # noqa: E402

_list = M.list_mutants
HOST = ("_config", "_overlaps", "_capability", "chunk_ssd", "_pow2")


def one_side(host: bool):
    def listed(root, module, files):
        ms = _list(root, module, files)
        tree = ast.parse((root / "kernels/ssd.py").read_text())
        spans = [(n.lineno, n.end_lineno) for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in HOST]
        return [m for m in ms if m.path != "kernels/ssd.py" or any(a <= m.line <= b for a, b in spans) == host]

    return listed


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("host", "kernel"):
        print("usage: ssd_sites.py host|kernel MUTATION-ARGS...", file=sys.stderr)
        sys.exit(2)
    M.list_mutants = one_side(sys.argv[1] == "host")
    sys.exit(M.main(sys.argv[2:]))

"""benchmarks/mutation.py with kernels/ssd.py's sites limited to its host-side functions (the
launcher and its configuration): the kernels' OVL branches never run in the interpreter."""

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import mutation as M  # noqa: E402

_list = M.list_mutants
HOST = ("_config", "_overlaps", "_capability", "chunk_ssd", "_pow2")


def host_only(root, module, files):
    ms = _list(root, module, files)
    tree = ast.parse((root / "kernels/ssd.py").read_text())
    spans = [(n.lineno, n.end_lineno) for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in HOST]
    return [m for m in ms if m.path != "kernels/ssd.py" or any(a <= m.line <= b for a, b in spans)]


M.list_mutants = host_only
sys.exit(M.main(sys.argv[1:]))

import sys
from pathlib import Path

M = {
    "m121": (121, "(branch - start) % chunk", "(branch + start) % chunk"),
    "m149a": (149, "aligned > 0", "aligned > 1"),
    "m149b": (149, "aligned > 0", "aligned >= 0"),
    "m151": (151, "t > match.hit_sym * G", "t > match.hit_sym / G"),
    "m155": (
        155,
        "math.lcm(self.chunk(ctx), SGLANG_TRACK_INTERVAL)",
        "math.lcm(SGLANG_TRACK_INTERVAL, self.chunk(ctx))",
    ),
    "m180": (180, "kv[:2] <= st[:2]", "kv[:3] <= st[:2]"),
    "m148": (148, "n - 1)", "n - 0)"),
    "m178": (178, "kv is None and st is None", "kv is None and st is not None"),
}
tag = sys.argv[1]
src = Path("/work/main/policies/sglang.py").read_text().splitlines(keepends=True)
if tag != "base":
    line, old, new = M[tag]
    assert src[line - 1].count(old) == 1, (tag, src[line - 1])
    src[line - 1] = src[line - 1].replace(old, new)
Path("/tmp/sglmut/policies/sglang.py").write_text("".join(src))

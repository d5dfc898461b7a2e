"""Per-test before / after CPU s from the back-to-back runs (ab_<tag>_<side>.jsonl, made by
ab.sh): ``python table.py`` prints the markdown table of ../README.md."""

import json
from pathlib import Path

HERE = Path(__file__).parent
PAIRS = [  # (tag, before side, after side, pass)
    ("res", "before", "after", "main"),
    ("res", "before", "aftercold", "main (first run, cache cold)"),
    ("readme", "before", "after", "main"),
    ("replaycli", "before", "after", "main"),
    ("seg", "before", "after", "main"),
    ("buf", "before", "after", "main"),
    ("wide", "before", "after", "main"),
    ("wide", "before2", "after2", "main (again)"),
    ("runners", "before", "after", "main (not kept)"),
    ("res", "before39", "after39", "Triton 3.9"),
    ("res", "before39", "after39cold", "Triton 3.9 (first run, cache cold)"),
    ("seg", "before39", "after39", "Triton 3.9"),
]


def load(tag, side):
    rows = {}
    for line in (HERE / f"ab_{tag}_{side}.jsonl").read_text().splitlines():
        test, cpu, _ = json.loads(line)
        rows[test] = cpu
    return rows


print("| pass | test | before CPU s | after CPU s |")
print("|---|---|---:|---:|")
for tag, b, a, where in PAIRS:
    before, after = load(tag, b), load(tag, a)
    for test in list(before) + [t for t in after if t not in before]:
        x = f"{before[test]:.1f}" if test in before else "-"
        y = f"{after[test]:.1f}" if test in after else "- (removed)"
        print(f"| {where} | `{test.replace('tests/', '', 1)}` | {x} | {y} |")
    print(f"| {where} | **{tag} total** | **{sum(before.values()):.1f}** | **{sum(after.values()):.1f}** |")

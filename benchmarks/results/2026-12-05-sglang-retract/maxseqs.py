"""``benchmarks/differential_sglang.py`` with ``--max-num-seqs N`` given to the simulator's presets
(the harness has no such flag): the parent commit run at rule 19's cap, to tell the cap's own
effect from what it exposes.

    python benchmarks/results/2026-12-05-sglang-retract/maxseqs.py 30 --sglang ENGINES/sglang-0.5.23 \\
        --deps ENGINES/deps --sessions 100 --scheduler continuous --memory 10GB --pools \\
        --presets sglang/no_buffer --out base-maxseqs30-s10nb.csv
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

import differential_sglang as ds  # noqa: E402

n = int(sys.argv.pop(1))
for label, (policy, knobs, strategy) in list(ds.PRESETS.items()):
    ds.PRESETS[label] = (policy, {**knobs, "max_num_seqs": n}, strategy)
sys.argv[0] = "differential_sglang.py"
ds.main()

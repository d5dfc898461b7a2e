#!/usr/bin/env bash
# marconi run --policy sglang on the advise notebook's six workload halves (the notebook's
# defaults: --model qwen3.5-27b --gpu-memory 9360000000, the continuous scheduler); one line each.
set -euo pipefail
while IFS= read -r args; do
  # shellcheck disable=SC2086
  out=$(marconi run --policy sglang --model qwen3.5-27b --gpu-memory 9360000000 $args --format json --no-progress 2>/dev/null)
  echo "$args :: $(python3 -c 'import json,sys; d=json.load(sys.stdin)[0]; print({k: d[k] for k in ("token_hit_rate","ttft_p95_ms","preemptions","aborted_requests")})' <<<"$out")"
done <<'ARGS'
--trace sharegpt --sessions 24 --session-range 0:12
--trace sharegpt --sessions 24 --session-range 12:
--trace synthetic:agent:turns=12 --sessions 10 --session-range 0:5
--trace synthetic:agent:turns=12 --sessions 10 --session-range 5:
--trace mooncake:sample --time-scale 5.0 --session-range 0:150
--trace mooncake:sample --time-scale 5.0 --session-range 150:
ARGS

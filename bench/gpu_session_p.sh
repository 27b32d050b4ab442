#!/usr/bin/env bash
# Device call prepared at the end of the session of 2026-12-07 (tenth) for the next one, ≤ 9.5 min:
# the CUDA tests of the decode and prefill graphs (prefill widths now up to 2048), the deferred
# context and overlap; bench/churn_split.py at T = 1, c = 64 and 16 (do the speculative engines'
# prefills still cost more than the plain one's, now that 257–380-token prompts replay a graph?);
# then `bench offline --compare-static` at T = 1 unseeded (3 rounds) and T = 0 (2 rounds), c = 1 /
# 16 / 64, each concurrency after one untimed round of every engine (after: drained steps untimed,
# monotone costs, three-step re-timings, one uniform a plain row, the cheaper detokenizer).
# Usage on the device machine, from the repo root:  bash bench/gpu_session_p.sh
set -uo pipefail
source bench/device_prelude.sh
run_tests ${TEST_S:-150} tests/engine/test_cuda_graphs.py \
    tests/engine/test_prefill_graphs.py tests/engine/test_deferred_context.py tests/engine/test_overlap.py
for C in 64 16; do
  [ "$(left)" -lt 300 ] && { echo "skipped churn c=$C: $(left) s left"; continue; }
  timeout $(cap 120) python3 bench/churn_split.py --device cuda --dtype bfloat16 --concurrency $C \
      --prompts $((4 * C)) --output "$OUT/churn_split_c$C.json" 2>&1 | grep -v -i "warn\|token indices" | cut -c1-600
done
WARMUP_ROUNDS=1 compare_static "T1u:1:u:3 T0:0::2" 200
rm -f "$OUT"/*.png
echo "script seconds: $SECONDS"

#!/usr/bin/env bash
# Device call of the session of 2026-12-07 (eleventh), ≤ 9.5 min: the CUDA tests of the graphs, the
# deferred context (its append now two Triton launches, `ring_kernel.py`), overlap and prefill graphs;
# each width-1 graph's GPU work by engine (bench/graph_split.py: the speculative engine's extra
# over the plain one was 34–45 µs, 14–28 of them the ring's ~11 launches, the rest feature capture,
# whose adds are now gone; with a DDTree engine beside the chain, and both engines' kernels in one
# replay at 16 rows: what a tree step costs beyond a chain step); then `bench offline --compare-static` at T = 1 unseeded (3 rounds) and
# T = 0 (2 rounds), c = 1 / 16 / 64, each concurrency after one untimed round of every engine
# (after: drained steps untimed, monotone costs, quiet plain stretches, prefill graphs to 2048).
# Usage on the device machine, from the repo root:  bash bench/gpu_session_q.sh
set -uo pipefail
source bench/device_prelude.sh
run_tests ${TEST_S:-150} tests/attention/test_ring_kernel.py tests/engine/test_deferred_context.py \
    tests/engine/test_cuda_graphs.py tests/engine/test_prefill_graphs.py tests/engine/test_overlap.py
timeout $(cap ${SPLIT_S:-140}) python3 bench/graph_split.py --batches 1,16,64 --ddtree --output "$OUT/graph_split.json" \
    2>&1 | grep -v -i "warn" | tail -30 | tr -s ' \n' ' ' | cut -c1-3000; echo
WARMUP_ROUNDS=1 compare_static "T1u:1:u:3 T0:0::2" 200
[ "$(left)" -ge 100 ] && timeout $(cap 100) python3 bench/churn_split.py --device cuda --dtype bfloat16 --concurrency 16 \
    --prompts 64 --output "$OUT/churn_split_c16.json" 2>&1 | grep -v -i "warn\|token indices" | cut -c1-600
rm -f "$OUT"/*.png
echo "script seconds: $SECONDS"

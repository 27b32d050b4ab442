#!/usr/bin/env bash
# Device call of the session of 2026-12-07 (tenth), ≤ 9.5 min: the CUDA tests of the graphs (now one
# per sampling variant: greedy, sampled without filters, filtered), the deferred context, overlap and
# the policy; the GPU work of each width-1 graph by engine (bench/graph_split.py: plain, speculative,
# speculative without the ring's append); then `bench offline --compare-static` at T = 1 unseeded
# (3 rounds) and T = 0 (2 rounds), c = 1 / 16 / 64, after the fix of overlapped cost re-timings.
# Usage on the device machine, from the repo root:  bash bench/gpu_session_o.sh
set -uo pipefail
source bench/device_prelude.sh
run_tests ${TEST_S:-150} tests/engine/test_deferred_context.py \
    tests/engine/test_overlap.py tests/engine/test_cuda_graphs.py tests/engine/test_spec_policy.py
timeout $(cap ${SPLIT_S:-120}) python3 bench/graph_split.py --batches 1,16,64 --output "$OUT/graph_split.json" \
    2>&1 | grep -v -i "warn" | tail -60 | tr -s ' \n' ' ' | cut -c1-3000; echo
compare_static "T1u:1:u:3 T0:0::2" 170
rm -f "$OUT"/*.png
echo "script seconds: $SECONDS"

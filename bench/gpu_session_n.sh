#!/usr/bin/env bash
# Device call prepared at the end of the session of 2026-12-07 (ninth) for the next one, ≤ 9.5 min:
# first the CUDA test of the deferred-context ring (captured plain steps append their live rows; the
# device's write position equals the host's count) and the other deferred-context tests, which the
# ring has not yet passed on a GPU; then bench/host_split.py (the speculative engine's plain step
# against the plain engine's, by function), steady steps, and `bench offline --compare-static` at
# T = 1 unseeded (3 rounds) and T = 0 (2 rounds), c = 1 / 16 / 64.
# Usage on the device machine, from the repo root:  bash bench/gpu_session_n.sh
set -uo pipefail
source bench/device_prelude.sh
timeout $(cap ${TEST_S:-90}) python3 -m pytest -q -p no:cacheprovider -rfEs tests/engine/test_deferred_context.py \
    tests/engine/test_overlap.py tests/engine/test_cuda_graphs.py > "$OUT/cuda_tests_log.txt" 2>&1
tail -2 "$OUT/cuda_tests_log.txt"
timeout $(cap ${SPLIT_S:-100}) python3 bench/host_split.py --device cuda --dtype bfloat16 --batches 1,16,64 --steps 300 \
    --output "$OUT/host_split.json" 2>&1 | grep -v -i "warn" | cut -c1-700
timeout $(cap ${STEADY_S:-60}) python3 bench/steady_steps.py --device cuda --dtype bfloat16 --batches 1,16,64 \
    --widths 1 --rounds 3 --no-adaptive --output "$OUT/steady_steps_T1.json" 2>&1 | grep -v -i "warn\|graph replay" \
    | tail -6
compare_static "T1u:1:u:3 T0:0::2" 170
rm -f "$OUT"/*.png
echo "script seconds: $SECONDS"

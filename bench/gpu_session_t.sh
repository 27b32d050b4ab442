#!/usr/bin/env bash
# Device calls prepared in the session of 2026-12-07 (thirteenth) for the next one. ≤ 9.5 min each.
# PART=1: on an H200 the Kimi slice first (issue 14); the policy's host time inside a run at
#   c = 16, T = 0 and c = 1, T = 1 (speculative quiet stretches, SPEC_QUIET_STEPS 4: not yet measured
#   on a GPU; gpu_session_s measured 338 µs a step at c = 16 before them); `bench offline
#   --compare-static` at T = 0 (3 rounds after one untimed; each round's compiles, median and
#   slowest steps, the cost samples and GPU priors are in the JSON) and T = 1 unseeded (2 rounds).
# PART=3 (≤ 4 min): the two policy_live_time runs and compare-static at T = 0 with 2 rounds.
# Usage on the device machine, from the repo root:  PART=1 bash bench/gpu_session_t.sh
set -uo pipefail
source bench/device_prelude.sh
[ "${PART:-1}" = 1 ] && kimi_slice_on_h200
live_time 16 0 64
live_time 1 1 16
if [ "${PART:-1}" = 1 ]; then
  WARMUP_ROUNDS=1 compare_static "T0:0::3" 260
  show_rounds "$OUT/compare_static_gpu_T0.json"
  WARMUP_ROUNDS=1 compare_static "T1u:1:u:2" 190
  [ -f "$OUT/compare_static_gpu_T1u.json" ] && show_rounds "$OUT/compare_static_gpu_T1u.json"
else
  WARMUP_ROUNDS=1 compare_static "T0:0::2" 170
  show_rounds "$OUT/compare_static_gpu_T0.json"
fi
rm -f "$OUT"/*.png
echo "script seconds: $SECONDS"

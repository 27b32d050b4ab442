#!/usr/bin/env bash
# Device calls of the session of 2026-12-07 (thirteenth). ≤ 9.5 min each.
# PART=1: why adaptive lost a whole round at T = 0, c = 16 in gpu_session_r (0.83 s against
#   0.22 s for its other round): `bench offline --compare-static` at T = 0 (3 rounds after one
#   untimed) now records per round the Triton compiles inside it and its slowest steps; then T = 1
#   unseeded (2 rounds).
# Usage on the device machine, from the repo root:  PART=1 bash bench/gpu_session_s.sh
set -uo pipefail
source bench/device_prelude.sh
if [ "${PART:-1}" = 1 ]; then
  kimi_slice_on_h200
  WARMUP_ROUNDS=1 compare_static "${T0_RUN:-T0:0::3}" 260
  show_rounds "$OUT/compare_static_gpu_T0.json"
  # Quiet plain stretches now last until a due re-timing can run (full choices on 53 % of steps in
  # gpu_session_r's c = 1, T = 1 run).
  live_time 1 1 16
  # The acceptance model's per-row Python path up to 16 rows against numpy's above 6 (cold caches
  # made numpy's observe of 16 rows 206 µs on the CPU, a Python prototype 74).
  live_time 16 0 64
  live_time 16 0 64 --scalar-rows 16
  WARMUP_ROUNDS=1 compare_static "T1u:1:u:2" 190
  show_rounds "$OUT/compare_static_gpu_T1u.json"
  rm -f "$OUT"/*.png
fi
echo "script seconds: $SECONDS"

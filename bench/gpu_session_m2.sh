#!/usr/bin/env bash
# Second device call of the session of 2026-12-07 (ninth), ≤ 6 min: issue 15 after the deferred
# context flushes by bytes and the policy's table check moved off the per-step path. Where the
# speculative engine's plain step spends its extra host time (bench/host_split.py, 16 and 64 rows),
# steady steps of the plain engine and the speculative one held at width 1, then `bench offline
# --compare-static` at T = 1 unseeded (3 rounds) and T = 0 (2 rounds), c = 1 / 16 / 64.
# Usage on the device machine, from the repo root:  bash bench/gpu_session_m2.sh
set -uo pipefail
DEADLINE=${DEADLINE:-420}
source bench/device_prelude.sh
timeout $(cap ${SPLIT_S:-100}) python3 bench/host_split.py --device cuda --dtype bfloat16 --batches 16,64 --steps 300 \
    --output "$OUT/host_split.json" 2>&1 | grep -v -i "warn" | cut -c1-700
timeout $(cap ${STEADY_S:-60}) python3 bench/steady_steps.py --device cuda --dtype bfloat16 --batches 16,64 \
    --widths 1 --rounds 3 --no-adaptive --output "$OUT/steady_steps_T1.json" 2>&1 | grep -v -i "warn\|graph replay" \
    | tail -4
compare_static "T1u:1:u:3 T0:0::2" 150
rm -f "$OUT"/*.png
echo "script seconds: $SECONDS"

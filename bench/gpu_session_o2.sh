#!/usr/bin/env bash
# Second device call of the session of 2026-12-07 (tenth): bench/churn_split.py at T = 1, c = 64 and
# c = 16 (the compare-static workload through the plain, static chain 4 and adaptive engines, with
# the engine's functions timed), to find what the adaptive policy's step costs leave out.
# Usage on the device machine, from the repo root:  DEADLINE=… bash bench/gpu_session_o2.sh
set -uo pipefail
source bench/device_prelude.sh
for C in 64 16; do
  [ "$(left)" -lt 60 ] && { echo "skipped c=$C: $(left) s left"; continue; }
  timeout $(cap 200) python3 bench/churn_split.py --device cuda --dtype bfloat16 --concurrency $C \
      --prompts $((4 * C)) --output "$OUT/churn_split_c$C.json" 2>&1 | grep -v -i "warn\|token indices" | cut -c1-1500
done
echo "script seconds: $SECONDS"

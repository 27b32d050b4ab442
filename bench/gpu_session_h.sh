#!/usr/bin/env bash
# Device calls of the session of 2026-12-06 (fourth), issue 15: where a speculative engine's plain
# step goes beyond a plain engine's (bench/steady_steps.py: fixed batches, forced widths, the free
# policy, kernel time per step), then `bench offline --compare-static` at c = 16 / 32 / 64 with
# 256 prompts a cell (T = 1 without seeds, and T = 0).
# Usage on the device machine:  PART=1 bash bench/gpu_session_h.sh   (.carry: bash bench/make_carry.sh --site-only)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.carry/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
git log -1 --format=%h > "$OUT/build.txt" 2>/dev/null || true
if [ "${PART:-1}" = 1 ]; then
  timeout 200 python3 bench/steady_steps.py --device cuda --dtype bfloat16 --batches 1,16,64 --widths 1,2,4,16 \
      --profile --output "$OUT/steady_steps_T1.json" 2>&1 | grep -v -i "warn" | tee "$OUT/steady_steps_T1_log.txt"
fi
if [ "${PART:-1}" = 1 ] || [ "${PART:-1}" = 2 ]; then
  RUNS=${RUNS:-"T1u:1:u T0:0"} CONC=${CONC:-16,32,64} PROMPTS=${PROMPTS:-256} REPEATS=${REPEATS:-2} \
      CELL_S=${CELL_S:-170} bash bench/gpu_session_e.sh
fi
# PART=3, the final build: every concurrency, 32 prompts or 4 per request slot a cell (so c = 64 runs
# 256 prompts, not two waves of ramp and tail), then the steady steps without profiling.
if [ "${PART:-1}" = 3 ]; then
  RUNS="T1u:1:u" CONC=${CONC3:-1,2,4,8,16,32,64} PROMPTS=32 WAVES=4 REPEATS=2 CELL_S=${CELL_S:-250} bash bench/gpu_session_e.sh
  RUNS="T0:0" CONC=${CONC3:-1,2,4,8,16,32,64} PROMPTS=32 WAVES=4 REPEATS=2 CELL_S=${CELL_S0:-200} bash bench/gpu_session_e.sh
  [ -n "${STEADY:-}" ] && timeout 75 python3 bench/steady_steps.py --device cuda --dtype bfloat16 --batches 1,16,64 \
      --widths 1,16 --rounds 2 --output "$OUT/steady_steps_T1.json" 2>&1 | grep -v -i "warn\|graph replay"
fi

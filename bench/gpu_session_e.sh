#!/usr/bin/env bash
# Issue 15 on the GPU (≤ 9.5 min): `bench offline --compare-static` of the bundled pair — plain,
# static chains 2 / 4 / 8 / 16 and the adaptive policy — at concurrency 1 … 64, T = 0 and T = 1
# (bench offline seeds every request, so at T = 1 its rows sample by the exponential race,
# blockspec/seeded_sampling.py; a run marked unseeded sends no seeds, so the verifiers sample). Each JSON also holds the adaptive policy's timed cost per bucket.
# Usage on the device machine:  bash bench/gpu_session_e.sh   (.carry from bash bench/make_carry.sh --site-only)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.carry/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
# RUNS: label:temperature[:unseeded] (unseeded: requests without a seed)
for RUN in ${RUNS:-T0:0 T1:1}; do
  IFS=: read -r NAME T SEEDS <<< "$RUN"
  timeout ${CELL_S:-270} python3 -m blockspec.cli bench offline --model blockspec/bundled/target \
      --draft-model blockspec/bundled/drafter --device cuda --dtype bfloat16 --dataset sharegpt --temperature $T \
      --num-prompts ${PROMPTS:-64} --max-tokens 128 --compare-static --concurrency ${CONC:-1,2,4,8,16,32,64} \
      --repeats ${REPEATS:-3} --waves ${WAVES:-2} ${SEEDS:+--unseeded} --no-progress --output "$OUT/compare_static_gpu_$NAME.json" \
      > "$OUT/log_$NAME.txt" 2>&1
  grep -v -i "warn\|token indices" "$OUT/log_$NAME.txt" | tail -12
done

#!/usr/bin/env bash
# The W4A16 kernel's N-major layout on the GPU (≤ 9.5 min a call; .carry from
# `bash bench/make_carry.sh --site-only`, carried). PART=1: the W4A16 / INT4-expert tests on CUDA
# (bf16 included), the tiling sweep at Kimi's expert shapes (bench/w4a16_tune_gpu.py), the Kimi
# slice with INT4 experts. PART=2: the slice alone (after the sweep's tiling became the default).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.carry/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
slice() {
  timeout ${SLICE_S:-150} python3 -m blockspec.cli bench step --shape kimi-k2-slice --int4-experts --profile \
      --output "$OUT/step_kimi_slice_int4.json" 2>&1 | grep -v -i warn | tail -20 | tee "$OUT/step_kimi_slice_int4.txt"
}
if [ "${PART:-1}" = 1 ]; then
  timeout ${TEST_S:-120} python3 -m pytest -q -p no:cacheprovider -rfE --junitxml="$OUT/cuda_tests.xml" \
      tests/layers/test_w4a16.py tests/layers/test_int4_experts.py > "$OUT/cuda_tests_log.txt" 2>&1
  tail -5 "$OUT/cuda_tests_log.txt"
  timeout ${SWEEP_S:-330} python3 bench/w4a16_tune_gpu.py --output "$OUT/w4a16_tune.json" --budget-s ${BUDGET_S:-240} \
      2>&1 | tee "$OUT/w4a16_tune_log.txt" | grep -v -i warn | tail -12
  slice
else
  slice
fi

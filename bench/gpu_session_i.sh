#!/usr/bin/env bash
# Device calls of the session of 2026-12-06 (fifth). PART=1, issue 14 on an H200: the Kimi slice
# (`bench step --shape kimi-k2-slice`, INT4 experts as Kimi ships them, then bf16 experts), and the
# MLA kernel's untried 64-head tilings (64-key steps over 8 warps; deeper pipelines); first the CUDA
# tests of plain steps' deferred drafter context (issue 15).
# PART=3: issue 15's final build (bench/gpu_session_h.sh PART=3).
# Usage on the device machine:  PART=1 bash bench/gpu_session_i.sh   (.carry: bash bench/make_carry.sh --site-only)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.carry/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
if [ "${PART:-1}" = 1 ]; then
  # Plain steps' deferred drafter context under captured graphs and overlap (issue 15).
  timeout ${TEST_S:-100} python3 -m pytest -q -p no:cacheprovider -rfE tests/engine/test_deferred_context.py \
      "tests/engine/test_cuda_graphs.py::test_adaptive_width_graphs_equal_eager" \
      tests/engine/test_overlap.py > "$OUT/cuda_tests_log.txt" 2>&1
  tail -4 "$OUT/cuda_tests_log.txt"
  timeout ${SLICE_S:-170} python3 -m blockspec.cli bench step --shape kimi-k2-slice --int4-experts --profile \
      --output "$OUT/step_kimi_slice_int4.json" 2>&1 | grep -v -i warn | tail -14 | tee "$OUT/step_kimi_slice_int4.txt"
  timeout ${SLICE_S:-170} python3 -m blockspec.cli bench step --shape kimi-k2-slice \
      --output "$OUT/step_kimi_slice_bf16.json" 2>&1 | grep -v -i warn | tail -12 | tee "$OUT/step_kimi_slice_bf16.txt"
  timeout ${MLA_S:-150} python3 bench/mla_tune_gpu.py --output "$OUT/mla_tune.json" --budget-s 100 \
      --configs "64,64,1,8,2;64,64,1,8,1;64,32,1,8,3;64,32,1,8,1;64,64,1,8,3;32,64,1,4,2;64,128,1,8,1" \
      2>&1 | grep -v -i warn | tee "$OUT/mla_tune_log.txt" | tail -8
fi
if [ "${PART:-1}" = 3 ]; then
  PART=3 bash bench/gpu_session_h.sh
fi

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
# PART=2: the CUDA tests again (deferred context, MLA defaults, adaptive graphs, overlap), then issue 15's
# compare-static on this build (deferred context, first looks, scaled exploration): plain, chain 4,
# chain 16 and adaptive at c = 1 / 4 / 16 / 64, T = 1 unseeded and T = 0; then two more MLA tilings.
if [ "${PART:-1}" = 2 ]; then
  timeout ${TEST_S:-110} python3 -m pytest -q -p no:cacheprovider -rfE tests/engine/test_deferred_context.py \
      tests/attention/test_triton_mla.py "tests/engine/test_cuda_graphs.py::test_adaptive_width_graphs_equal_eager" \
      tests/engine/test_overlap.py > "$OUT/cuda_tests_log.txt" 2>&1
  tail -4 "$OUT/cuda_tests_log.txt"
  for RUN in T1u:1:u T0:0; do
    IFS=: read -r NAME T SEEDS <<< "$RUN"
    timeout ${CELL_S:-200} python3 -m blockspec.cli bench offline --model blockspec/bundled/target \
        --draft-model blockspec/bundled/drafter --device cuda --dtype bfloat16 --dataset sharegpt --temperature $T \
        --num-prompts 32 --max-tokens 128 --compare-static --static-widths 4,16 --concurrency ${CONC:-1,4,16,64} \
        --repeats 2 --waves 4 ${SEEDS:+--unseeded} --no-progress --output "$OUT/compare_static_gpu_$NAME.json" \
        > "$OUT/log_$NAME.txt" 2>&1
    grep -v -i "warn\|token indices" "$OUT/log_$NAME.txt" | tail -7
  done
  rm -f "$OUT"/*.png     # (the device returns 8 files at most; plots are redrawn from the JSON)
  timeout 60 python3 bench/mla_tune_gpu.py --output /tmp/mla_tune.json --budget-s 30 \
      --configs "64,64,1,8,4;64,64,1,16,3" 2>&1 | grep -v -i warn | tail -7
fi
# PART=4 (≤ 6 min): the CUDA tests of PART=2, then compare-static at T = 1 unseeded only, c = 1 / 16 / 64
# (CONC, CELL_S to shorten it).
if [ "${PART:-1}" = 4 ]; then
  timeout ${TEST_S:-110} python3 -m pytest -q -p no:cacheprovider -rfE tests/engine/test_deferred_context.py \
      tests/attention/test_triton_mla.py "tests/engine/test_cuda_graphs.py::test_adaptive_width_graphs_equal_eager" \
      tests/engine/test_overlap.py > "$OUT/cuda_tests_log.txt" 2>&1
  tail -4 "$OUT/cuda_tests_log.txt"
  timeout ${CELL_S:-200} python3 -m blockspec.cli bench offline --model blockspec/bundled/target \
      --draft-model blockspec/bundled/drafter --device cuda --dtype bfloat16 --dataset sharegpt --temperature 1 \
      --num-prompts 32 --max-tokens 128 --compare-static --static-widths 16 --concurrency ${CONC:-1,16,64} \
      --repeats 2 --waves 4 --unseeded --no-progress --output "$OUT/compare_static_gpu_T1u.json" > "$OUT/log_T1u.txt" 2>&1
  grep -v -i "warn\|token indices" "$OUT/log_T1u.txt" | tail -6
  rm -f "$OUT"/*.png
fi
# PART=5 (≤ 2 min): the CUDA tests of PART=2 only.
if [ "${PART:-1}" = 5 ]; then
  timeout ${TEST_S:-110} python3 -m pytest -q -p no:cacheprovider -rfE tests/engine/test_deferred_context.py \
      tests/attention/test_triton_mla.py "tests/engine/test_cuda_graphs.py::test_adaptive_width_graphs_equal_eager" \
      tests/engine/test_overlap.py > "$OUT/cuda_tests_log.txt" 2>&1
  tail -8 "$OUT/cuda_tests_log.txt"
fi
if [ "${PART:-1}" = 3 ]; then
  PART=3 bash bench/gpu_session_h.sh
fi

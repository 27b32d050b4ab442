#!/usr/bin/env bash
# Device call of the session of 2026-12-07 (sixth), one call of ≤ 9.5 min on whatever card comes,
# each part cut by a deadline: the CUDA tests (deferred drafter context, MLA, adaptive graphs, overlap);
# issue 14's MLA key splits in whole waves (the default against explicit counts; 17 was the old choice
# at batch 16, 32k); on an H200 the Kimi slice (`bench step --shape kimi-k2-slice`, INT4 then bf16
# experts); then issue 15's compare-static at c = 1 / 16 / 64, T = 1 unseeded, then T = 0 in the time
# left (compare-static saves after every concurrency). At most 8 files come back.
# Usage on the device machine:  bash bench/gpu_session_j.sh   (.carry: bash bench/make_carry.sh --site-only)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.carry/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DEADLINE=${DEADLINE:-565}                       # seconds of this script's own run
left() { echo $(( DEADLINE - SECONDS )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; echo $(( want > 0 ? want : 1 )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
if [ "${PART:-1}" = short ]; then
  # What a short call can hold (DEADLINE=330): the MLA split sweep, the deferred-context CUDA tests,
  # then compare-static at T = 1 unseeded, c = 1 / 64, in the time left.
  timeout $(cap 100) python3 bench/mla_tune_gpu.py --output "$OUT/mla_splits.json" --iters 5 \
      --splits ${SPLITS:-1,2,4,5,8,12,16,17,24,33,44,64} 2>&1 | grep -v -i warn
  timeout $(cap 80) python3 -m pytest -q -p no:cacheprovider -rfE tests/engine/test_deferred_context.py \
      "tests/engine/test_cuda_graphs.py::test_adaptive_width_graphs_equal_eager" > "$OUT/cuda_tests_log.txt" 2>&1
  tail -3 "$OUT/cuda_tests_log.txt"
  [ "$(left)" -gt 60 ] && timeout $(cap 200) python3 -m blockspec.cli bench offline --model blockspec/bundled/target \
      --draft-model blockspec/bundled/drafter --device cuda --dtype bfloat16 --dataset sharegpt --temperature 1 \
      --num-prompts 32 --max-tokens 128 --compare-static --static-widths 16 --concurrency 1,64 \
      --repeats 2 --waves 4 --unseeded --no-progress --output "$OUT/compare_static_gpu_T1u.json" 2>&1 \
      | grep -v -i "warn\|token indices" | tail -7
  rm -f "$OUT"/*.png; echo "script seconds: $SECONDS"; exit 0
fi
timeout $(cap ${TEST_S:-100}) python3 -m pytest -q -p no:cacheprovider -rfE tests/engine/test_deferred_context.py \
    tests/attention/test_triton_mla.py "tests/engine/test_cuda_graphs.py::test_adaptive_width_graphs_equal_eager" \
    tests/engine/test_overlap.py > "$OUT/cuda_tests_log.txt" 2>&1
tail -4 "$OUT/cuda_tests_log.txt"
timeout $(cap ${MLA_S:-100}) python3 bench/mla_tune_gpu.py --output "$OUT/mla_splits.json" \
    --splits 1,2,4,5,8,12,16,17,24,33,44,64 2>&1 | grep -v -i warn
if grep -q H200 "$OUT/device.txt"; then
  timeout $(cap ${SLICE_S:-140}) python3 -m blockspec.cli bench step --shape kimi-k2-slice --int4-experts --profile \
      --output "$OUT/step_kimi_slice_int4.json" 2>&1 | grep -v -i warn | tail -14
  timeout $(cap ${SLICE_S:-110}) python3 -m blockspec.cli bench step --shape kimi-k2-slice \
      --output "$OUT/step_kimi_slice_bf16.json" 2>&1 | grep -v -i warn | tail -12
fi
for RUN in T1u:1:u T0:0; do
  IFS=: read -r NAME T SEEDS <<< "$RUN"
  [ "$(left)" -lt 60 ] && { echo "skipped $NAME: $(left) s left"; continue; }
  timeout $(cap ${CELL_S:-200}) python3 -m blockspec.cli bench offline --model blockspec/bundled/target \
      --draft-model blockspec/bundled/drafter --device cuda --dtype bfloat16 --dataset sharegpt --temperature $T \
      --num-prompts 32 --max-tokens 128 --compare-static --static-widths 4,16 --concurrency ${CONC:-1,16,64} \
      --repeats 2 --waves 4 ${SEEDS:+--unseeded} --no-progress --output "$OUT/compare_static_gpu_$NAME.json" \
      > "/tmp/log_$NAME.txt" 2>&1
  grep -v -i "warn\|token indices" "/tmp/log_$NAME.txt" | tail -9
done
rm -f "$OUT"/*.png     # (plots are redrawn from the JSON)
echo "script seconds: $SECONDS"

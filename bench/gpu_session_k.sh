#!/usr/bin/env bash
# Device call of the session of 2026-12-07 (seventh; it replaces the sixth session's gpu_session_j.sh, which
# never ran: no device could be started), one call of ≤ 9.5 min on whatever card comes,
# each part cut by a deadline: issue 14's MLA key splits in whole waves (the default against explicit
# counts; 17 was the old choice at batch 16, 32k); the deferred-context and adaptive-graph CUDA tests;
# where a DDTree step's time goes against a DFlash chain's on the bundled pair at batch 1 (graphed,
# bf16, cProfile of 40 whole steps each); on an H200 the Kimi slice; then issue 15's compare-static at
# c = 1 / 16 / 64, T = 1 unseeded, then T = 0 in the time left. At most 8 files come back.
# Usage on the device machine:  bash bench/gpu_session_k.sh   (.carry: bash bench/make_carry.sh --site-only)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.carry/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DEADLINE=${DEADLINE:-565}                       # seconds of this script's own run
left() { echo $(( DEADLINE - SECONDS )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; echo $(( want > 0 ? want : 1 )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
timeout $(cap ${TEST_S:-80}) python3 -m pytest -q -p no:cacheprovider -rfE tests/engine/test_deferred_context.py \
    tests/attention/test_walk_kernel.py tests/attention/test_children_kernel.py "tests/test_ddtree.py::test_sampled_tree_verified_by_the_kernels_equals_the_reference" \
    "tests/engine/test_cuda_graphs.py::test_adaptive_width_graphs_equal_eager" > "$OUT/cuda_tests_log.txt" 2>&1
tail -3 "$OUT/cuda_tests_log.txt"
# (each: 40 whole steps of the bundled pair at batch B, static widths, cProfile; ddtree with the verify
# kernels and with the reference ops, greedy and at T = 0.6 top_p 0.95)
for CASE in "1 dflash 0" "1 ddtree 0" "1 ddtree 0 --reference-tree-ops" "16 dflash 0" "16 ddtree 0" \
            "1 dflash 0.6" "1 ddtree 0.6" "1 ddtree 0.6 --reference-tree-ops" "16 dflash 0.6" "16 ddtree 0.6" \
            "16 ddtree 0.6 --reference-tree-ops" "16 ddtree 0 --reference-tree-ops" "1 none 0"; do
  read -r B SPEC T EXTRA <<< "$CASE"
  [ "$(left)" -lt ${PROFILE_FLOOR:-250} ] && break
  timeout $(cap 30) python3 bench/host_overhead.py --device cuda --dtype bfloat16 --real-forward --batch $B \
      --steps 40 --spec $SPEC --spec-policy static --temperature $T --top-p 0.95 $EXTRA --profile 2>&1 \
      | grep -v -i warn | head -30
done > "$OUT/tree_vs_chain_profile.txt"
grep "host ms" "$OUT/tree_vs_chain_profile.txt"
timeout $(cap ${MLA_S:-70}) python3 bench/mla_tune_gpu.py --output "$OUT/mla_splits.json" --iters 5 \
    --splits 1,2,4,5,8,12,16,17,24,33,44,64 2>&1 | grep -v -i warn | tail -20
if grep -q H200 "$OUT/device.txt"; then
  timeout $(cap ${SLICE_S:-120}) python3 -m blockspec.cli bench step --shape kimi-k2-slice --int4-experts --profile \
      --output "$OUT/step_kimi_slice_int4.json" 2>&1 | grep -v -i warn | tail -14
fi
for RUN in T1u:1:u T0:0; do
  IFS=: read -r NAME T SEEDS <<< "$RUN"
  [ "$(left)" -lt 60 ] && { echo "skipped $NAME: $(left) s left"; continue; }
  timeout $(cap ${CELL_S:-190}) python3 -m blockspec.cli bench offline --model blockspec/bundled/target \
      --draft-model blockspec/bundled/drafter --device cuda --dtype bfloat16 --dataset sharegpt --temperature $T \
      --num-prompts 32 --max-tokens 128 --compare-static --static-widths 4,16 --concurrency ${CONC:-1,16,64} \
      --repeats 2 --waves 4 ${SEEDS:+--unseeded} --no-progress --output "$OUT/compare_static_gpu_$NAME.json" \
      > "/tmp/log_$NAME.txt" 2>&1
  grep -v -i "warn\|token indices" "/tmp/log_$NAME.txt" | tail -9
done
rm -f "$OUT"/*.png     # (plots are redrawn from the JSON)
echo "script seconds: $SECONDS"

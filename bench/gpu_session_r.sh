#!/usr/bin/env bash
# Device calls prepared in the session of 2026-12-07 (eleventh) for the next one, two parts of
# ≤ 9.5 min each (PART=1, then PART=2; the session had 30 device minutes and lost 12 to failed starts).
# PART=1:
# 1. the graphed-vs-eager DDTree test that failed on the H100 in gpu_session_q call 9 (its log was
#    cut: here alone first, with its traceback), then the other graph, deferred-context and
#    append-kernel tests;
# 2. bench/attn_calls.py: each engine's paged-attention launches and the kernels of its width-1 and
#    width-16 graphs (why the DDTree engine's graphs cost 1.3–1.9× the chain engine's), and paged
#    attention alone at cached contexts 0 / 256 / 1024, causal against tree masks;
# 3. bench/policy_live_time.py: the policy's host time inside a real run at c = 1 and 16 (≈ 95 µs a
#    step on average in gpu_session_q, 20 % of a plain step at c = 1), and at c = 16 pinned to
#    width 16, T = 0, the acceptance model's per-row path up to 6 or 64 rows (on the 2-core CPU 64
#    halved a speculative step's observe; in the policy-only loop it is 5× slower at 64 rows).
# PART=2: `bench offline --compare-static` at T = 1 unseeded (3 rounds) and T = 0 (2 rounds),
#    c = 1 / 16 / 64, each concurrency after one untimed round: after the context write charged
#    to leaving plain and the policy's host-time cuts.
# Usage on the device machine, from the repo root:  PART=1 bash bench/gpu_session_r.sh
set -uo pipefail
source bench/device_prelude.sh
if [ "${PART:-1}" = 1 ]; then
  if grep -q H200 "$OUT/device.txt"; then   # issue 14 asks its Kimi-slice figure on this card
    timeout $(cap ${SLICE_S:-150}) python3 -m blockspec.cli bench step --shape kimi-k2-slice --int4-experts --profile \
        --output "$OUT/step_kimi_slice_int4_h200.json" 2>&1 | grep -v -i warn | tail -14 | tee "$OUT/step_kimi_slice_int4_h200.txt"
  fi
  timeout $(cap 90) python3 -m pytest -q -x -p no:cacheprovider -rfE "tests/engine/test_cuda_graphs.py" -k "ddtree" \
      > "$OUT/cuda_tests_ddtree_log.txt" 2>&1
  grep -E "passed|failed|Error|assert" "$OUT/cuda_tests_ddtree_log.txt" | head -20
  run_tests ${TEST_S:-100} tests/attention/test_ring_kernel.py tests/engine/test_deferred_context.py \
      tests/engine/test_cuda_graphs.py
  timeout $(cap ${ATTN_S:-100}) python3 bench/attn_calls.py --batch 16 --output "$OUT/attn_calls.json" \
      2>&1 | grep -v -i "warn" | tail -30 | tr -s ' \n' ' ' | cut -c1-2500; echo
  for C in 1 16; do
    timeout $(cap 60) python3 bench/policy_live_time.py --device cuda --dtype bfloat16 --concurrency $C --split \
        --prompts $((C > 1 ? 64 : 16)) --max-tokens 128 2>&1 | grep -v -i "warn\|token indices" | tail -1 \
        | tee -a "$OUT/policy_live_time.txt"
  done
  timeout $(cap 60) python3 bench/policy_live_time.py --device cuda --dtype bfloat16 --concurrency 16 --prompts 64 \
      --max-tokens 128 --temperature 0 --split 2>&1 | grep -v -i "warn\|token indices" | tail -1 | tee -a "$OUT/policy_live_time.txt"
  for SR in 6 64; do
    timeout $(cap 60) python3 bench/policy_live_time.py --device cuda --dtype bfloat16 --concurrency 16 --prompts 64 \
        --max-tokens 128 --temperature 0 --pin-width 16 --scalar-rows $SR --split 2>&1 | grep -v -i "warn\|token indices" \
        | tail -1 | tee -a "$OUT/policy_live_time_scalar_rows.txt"
  done
else
  WARMUP_ROUNDS=1 compare_static "T1u:1:u:3 T0:0::2" 250
  rm -f "$OUT"/*.png
fi
echo "script seconds: $SECONDS"

#!/usr/bin/env bash
# Device calls prepared in the session of 2026-12-07 (eleventh) for the next one; PART=1 reordered
# in the twelfth around its chain acceptance model (engine/chain_acceptance.py). ≤ 9.5 min each.
# PART=1: on an H200 the Kimi slice first (issue 14); the graphed-vs-eager DDTree test that failed
#   once on the H100 in gpu_session_q call 9 (alone, with its traceback); `bench offline
#   --compare-static` at T = 0 (2 rounds after one untimed, c = 1 / 16 / 64); bench/policy_live_time.py
#   (the policy's host time inside a real run, its choices and cost tables) at c = 1, T = 1 and
#   c = 16, T = 0; bench/attn_calls.py (each engine's paged-attention launches and graph kernels,
#   and paged attention alone at contexts 0 / 256 / 1024, causal against tree masks: issue 16's
#   sampled trees); compare-static at T = 1 unseeded.
# PART=3 (≤ 4 min): policy_live_time at c = 1, T = 1 and c = 16, T = 0; attention's mask_cost; the
#   DDTree graph test.
# PART=2: the ring, deferred-context and CUDA-graph tests, then compare-static T = 1 unseeded
#   (3 rounds) and T = 0 (2 rounds).
# Usage on the device machine, from the repo root:  PART=1 bash bench/gpu_session_r.sh
set -uo pipefail
source bench/device_prelude.sh
if [ "${PART:-1}" = 1 ]; then
  kimi_slice_on_h200
  timeout $(cap 60) python3 -m pytest -q -x -p no:cacheprovider -rfE "tests/engine/test_cuda_graphs.py" -k "ddtree" \
      > "$OUT/cuda_tests_ddtree_log.txt" 2>&1
  grep -E "passed|failed|Error|assert" "$OUT/cuda_tests_ddtree_log.txt" | head -20
  # Chains' per-position acceptance (engine/chain_acceptance.py): T = 0 first, where the per-width
  # figures lost 5–22 % to the static chain 16 (gpu_session_q).
  WARMUP_ROUNDS=1 compare_static "T0:0::2" 190
  live_time 1 1 16
  live_time 16 0 64
  timeout $(cap ${ATTN_S:-80}) python3 bench/attn_calls.py --batch 16 --output "$OUT/attn_calls.json" \
      2>&1 | grep -v -i "warn" | tail -30 | tr -s ' \n' ' ' | cut -c1-2500; echo
  WARMUP_ROUNDS=1 compare_static "T1u:1:u:2" 190
  rm -f "$OUT"/*.png
elif [ "${PART:-1}" = 3 ]; then   # ≤ 4 min: what a short call can still tell
  live_time 1 1 16
  live_time 16 0 64
  timeout $(cap 60) python3 -c "import json; from bench.attn_calls import mask_cost; print(json.dumps(mask_cost()))" \
      2>&1 | tail -3 | tee "$OUT/mask_cost.json"
  timeout $(cap 60) python3 -m pytest -q -x -p no:cacheprovider -rfE "tests/engine/test_cuda_graphs.py" -k "ddtree" \
      > "$OUT/cuda_tests_ddtree_log.txt" 2>&1
  grep -E "passed|failed|Error|assert" "$OUT/cuda_tests_ddtree_log.txt" | head -20
else
  run_tests ${TEST_S:-100} tests/attention/test_ring_kernel.py tests/engine/test_deferred_context.py \
      tests/engine/test_cuda_graphs.py
  WARMUP_ROUNDS=1 compare_static "T1u:1:u:3 T0:0::2" 250
  rm -f "$OUT"/*.png
fi
echo "script seconds: $SECONDS"

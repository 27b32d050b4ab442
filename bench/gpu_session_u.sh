#!/usr/bin/env bash
# Device calls prepared in the session of 2026-12-08 (fourteenth) for the next one. ≤ 9.5 min each.
# PART=1: the paged kernel's tree masks as packed bits on CUDA first (its tests, then mask_cost:
#   causal against tree masks at contexts 0 / 256 / 1,024, was 0.068 / 0.114, 0.095 / 0.103,
#   0.105 / 0.157 ms in gpu_session_r), the DDTree engine's graphs against the chain engine's
#   (bench/graph_split.py --ddtree: gpu_session_q had a tree step 1.58–1.90× a chain's, paged
#   attention 259 against 70 µs of it); on an H200 the Kimi slice (issue 14); then the thirteenth
#   session's plan (bench/gpu_session_t.sh PART=3: the policy's host time with speculative quiet
#   stretches, compare-static T = 0).
# PART=2 (≤ 9 min): static DFlash block 16, DFlash with --sampled-trees (chains for greedy rows, sampled
#   trees for sampled ones) and DDTree-15 (`bench offline`, batch 1 and 16, T = 0 / 0.6 / 1 unseeded):
#   whether sampled trees pay on the GPU where chains do (issue 16's default-server target waits on it:
#   on the CPU --sampled-trees accepts 3.22 / 2.00 against the chain's 2.54 / 1.67 at T = 0.6 / 1).
# PART=3 (≤ 6 min): `check temperature` against a GPU server with --sampled-trees and a default one
#   (issue 16's target: accept length ≥ 2.0 at T = 1 on the default server), then `bench serve` T = 0.6
#   and 1 at c = 1 / 16 against each (seeded, as check temperature sends).
# Usage on the device machine, from the repo root:  PART=1 bash bench/gpu_session_u.sh
set -uo pipefail
source bench/device_prelude.sh
if [ "${PART:-1}" = 1 ]; then
  run_tests 100 tests/attention/test_triton_paged.py tests/attention/test_engine_triton.py \
      tests/engine/test_cuda_graphs.py tests/test_ddtree.py \
      -k "paged or engine_triton or sampled_trees or graphed_steps_equal_eager or kernels_equals"
  timeout $(cap 60) python3 -c "import json; from bench.attn_calls import mask_cost; print(json.dumps(mask_cost()))" \
      2>&1 | tail -1 | tee "$OUT/mask_cost.json"
  timeout $(cap 120) python3 bench/graph_split.py --batches 1,16 --ddtree --output "$OUT/graph_split.json" \
      2>&1 | grep -v -i warn | tail -12
  kimi_slice_on_h200
  DEADLINE=$(( DEADLINE - SECONDS )) PART=3 bash bench/gpu_session_t.sh
elif [ "${PART:-1}" = 3 ]; then
  PORT=8040
  for NAME in sampled_trees dflash; do
    [ "$(left)" -lt 100 ] && { echo "skipped $NAME: $(left) s left"; continue; }
    EXTRA=""; [ "$NAME" = sampled_trees ] && EXTRA="--sampled-trees"
    start_server $NAME $PORT $EXTRA
    echo "== $NAME: server up after ${SERVER_UP_S} s"
    timeout $(cap 70) python3 -m blockspec.cli check temperature --url http://127.0.0.1:$PORT 2>&1 \
        | tee "$OUT/check_temperature_$NAME.txt" | tail -12
    timeout $(cap 80) python3 -m blockspec.cli bench serve --url http://127.0.0.1:$PORT --dataset sharegpt \
        --num-prompts 24 --concurrency 1,16 --temperature 0.6,1.0 --max-tokens 128 --no-progress \
        --output-dir /tmp/bench_serve_$NAME 2>&1 | grep -v -i "warn\|failed, e.g. HTTP 400" | tail -8
    cp /tmp/bench_serve_$NAME/*.json "$OUT/" 2>/dev/null
    kill $SERVER; wait $SERVER 2>/dev/null
    grep -v "INFO:\|^$" "/tmp/server_$NAME.log" | cut -c1-300 | head -30 > "$OUT/server_log_$NAME.txt"
    PORT=$(( PORT + 1 ))
  done
else
  for T in 0 0.6 1; do
    for SPEC in "dflash" "dflash --sampled-trees" "ddtree --budget 15"; do
      for B in 1 16; do
        [ "$(left)" -lt 40 ] && break
        timeout $(cap 40) python3 -m blockspec.cli bench offline --model blockspec/bundled/target \
            --draft-model blockspec/bundled/drafter --device cuda --dtype bfloat16 --dataset sharegpt --num-prompts 16 \
            --max-tokens 128 --temperature $T --unseeded --batch-size $B --spec $SPEC --spec-policy static --no-progress \
            --output "$OUT/offline_T${T}_b${B}_$(echo $SPEC | tr -d ' -').json" 2>&1 | grep -v -i "warn\|token indices" | tail -2
      done
    done
  done
fi
[ "${PART:-1}" = 2 ] && python3 bench/tree_vs_chain.py "$OUT" | tee "$OUT/tree_vs_chain.txt"
echo "script seconds: $SECONDS"

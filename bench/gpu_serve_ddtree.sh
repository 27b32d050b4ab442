#!/usr/bin/env bash
# One device call (≤ 9.5 min): should the default server speculate with DDTree instead of DFlash?
# Two `blockspec serve` runs on the bundled pair (CUDA graphs, bf16, adaptive policy), the default
# (DFlash block 16) and `--spec ddtree` (budget 16), each measured by `bench serve` (held-out ShareGPT
# chats, 128 tokens, concurrency 1 / 16 / 64, T = 0 and 1) and `check temperature` (issue 16's
# last target: accept length ≥ 2.0 at T = 1 on the default server).
# Needs .whl (fastapi, uvicorn, pydantic… for Python 3.12) and .carry/site carried.
# The tree kernels' CUDA tests run first.
# Usage on the device machine, from the repo root:  bash bench/gpu_serve_ddtree.sh
set -uo pipefail
DEADLINE=${DEADLINE:-560}
source bench/device_prelude.sh
# First the tree kernels' CUDA tests (the default may only switch to trees verified by kernels that pass).
timeout ${TEST_S:-60} python3 -m pytest -q -p no:cacheprovider -rfE tests/attention/test_walk_kernel.py \
    tests/attention/test_children_kernel.py "tests/test_ddtree.py::test_sampled_tree_verified_by_the_kernels_equals_the_reference" \
    > "$OUT/cuda_tests_log.txt" 2>&1
tail -3 "$OUT/cuda_tests_log.txt"
PORT=8123
for NAME in ${SERVERS:-dflash ddtree}; do
  [ "$(left)" -lt 120 ] && { echo "skipped $NAME: $(left) s left"; continue; }
  EXTRA=""; [ "$NAME" = ddtree ] && EXTRA="--spec ddtree --budget 16"
  start_server $NAME $PORT $EXTRA
  echo "== $NAME: server up after ${SERVER_UP_S} s"
  timeout $(( $(left) / 2 < ${SERVE_S:-130} ? $(left) / 2 : ${SERVE_S:-130} )) python3 -m blockspec.cli bench serve --url http://127.0.0.1:$PORT \
      --dataset sharegpt --num-prompts ${PROMPTS:-24} --concurrency ${CONC:-1,16,64} --temperature 0,1.0 --max-tokens 128 \
      --no-progress --output-dir "/tmp/bench_serve_$NAME" 2>&1 | grep -v -i warn
  cp /tmp/bench_serve_$NAME/*.json "$OUT/bench_serve_$NAME.json" 2>/dev/null
  timeout $(( $(left) - 10 < ${CHECK_S:-80} ? $(left) - 10 : ${CHECK_S:-80} )) python3 -m blockspec.cli check temperature \
      --url http://127.0.0.1:$PORT 2>&1 | tee "$OUT/check_temperature_$NAME.txt"
  kill $SERVER; wait $SERVER 2>/dev/null
  grep -i -E "captured|warm-up|error|spec" "/tmp/server_$NAME.log" | head -8
  PORT=$(( PORT + 1 ))
done
echo "script seconds: $SECONDS"

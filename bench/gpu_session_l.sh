#!/usr/bin/env bash
# Device call of the session of 2026-12-07 (eighth), ≤ 9.5 min on whatever card comes: after the fix
# of the seeded-DDTree crash (a NaN tree from the race's top hash; it crashed the DDTree server in
# bench/gpu_serve_ddtree.sh's run), the tree and race kernels' CUDA tests, then a DDTree-16 server
# first (a cold Triton cache, as when it crashed) and the default DFlash server, each: bench serve once
# as warm-up (the sequence that crashed: 24 held-out ShareGPT chats, c = 1 / 16 / 64, T = 0 and 1,
# seeded), once measured, then `check temperature` (issue 16: accept length ≥ 2.0 at T = 1 on the
# default server). Then, in the time left, issue 15's compare-static at T = 1 unseeded.
# Needs .whl (fastapi, uvicorn, pydantic… for Python 3.12) and .carry/site (bash bench/make_carry.sh --site-only).
# Usage on the device machine, from the repo root:  bash bench/gpu_session_l.sh
set -uo pipefail
DEADLINE=${DEADLINE:-545}
source bench/device_prelude.sh
timeout $(cap ${TEST_S:-110}) python3 -m pytest -q -p no:cacheprovider -rfE tests/attention/test_tree_kernel.py \
    tests/attention/test_walk_kernel.py tests/attention/test_children_kernel.py tests/test_seeded_sampling.py::test_kernel_equals_the_torch_reference \
    tests/test_seeded_sampling.py::test_the_top_hash_value_gives_finite_noise "tests/test_ddtree.py::test_greedy_tree_walked_by_the_kernel_equals_plain" \
    "tests/test_ddtree.py::test_sampled_tree_verified_by_the_kernels_equals_the_reference" > "$OUT/cuda_tests_log.txt" 2>&1
tail -2 "$OUT/cuda_tests_log.txt"
PORT=8123
: > "$OUT/server_logs.txt"
bench() {  # $1 url, $2 output dir
  timeout $(cap ${SERVE_S:-70}) python3 -m blockspec.cli bench serve --url "$1" --dataset sharegpt --num-prompts 24 \
      --concurrency 1,16,64 --temperature 0,1.0 --max-tokens 128 --no-progress --output-dir "$2" 2>&1 \
      | grep -v -i "warn\|failed, e.g. HTTP 400"
}
for NAME in ${SERVERS:-ddtree dflash}; do
  [ "$(left)" -lt 130 ] && { echo "skipped $NAME: $(left) s left"; continue; }
  EXTRA=""; [ "$NAME" = ddtree ] && EXTRA="--spec ddtree --budget 16"
  start_server $NAME $PORT $EXTRA
  echo "== $NAME: server up after ${SERVER_UP_S} s; warm-up bench:"
  bench http://127.0.0.1:$PORT /tmp/warm_$NAME | head -9
  echo "== $NAME measured:"
  bench http://127.0.0.1:$PORT /tmp/bench_serve_$NAME
  cp /tmp/bench_serve_$NAME/*.json "$OUT/bench_serve_$NAME.json" 2>/dev/null
  timeout $(cap ${CHECK_S:-60}) python3 -m blockspec.cli check temperature --url http://127.0.0.1:$PORT 2>&1 \
      | tee "$OUT/check_temperature_$NAME.txt" | tail -12
  kill $SERVER; wait $SERVER 2>/dev/null
  { echo "== $NAME"; grep -v "INFO:\|^$" "/tmp/server_$NAME.log" | grep -v "step GPU time" | cut -c1-400 | head -60
    echo "assertions: $(grep -c Assertion /tmp/server_$NAME.log)"; } >> "$OUT/server_logs.txt"
  PORT=$(( PORT + 1 ))
done
if [ "$(left)" -gt 120 ]; then
  timeout $(cap 200) python3 -m blockspec.cli bench offline --model blockspec/bundled/target \
      --draft-model blockspec/bundled/drafter --device cuda --dtype bfloat16 --dataset sharegpt --temperature 1 \
      --num-prompts 32 --max-tokens 128 --compare-static --static-widths 4,16 --concurrency 1,16,64 \
      --repeats 2 --waves 4 --unseeded --no-progress --output "$OUT/compare_static_gpu_T1u.json" > /tmp/log_cs.txt 2>&1
  grep -v -i "warn\|token indices" /tmp/log_cs.txt | tail -9
fi
rm -f "$OUT"/*.png
echo "script seconds: $SECONDS"

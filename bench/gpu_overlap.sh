#!/usr/bin/env bash
# One device call (~8 min): overlapped decoding on the GPU. The CUDA tests of the graphed and
# overlapped engine and of the kernels/fused layers; `bench step` of the 8B and bundled shapes
# (sync step, replay-only, overlapped); the bundled pair's tokens/s with and without overlap
# (ids compared); the engine's whole step and first-prefill times (warm-up check).
# Usage on the device machine, from the repo root:  bash bench/gpu_overlap.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_overlap.py tests/engine/test_cuda_graphs.py \
    tests/layers 2>&1 | tail -5 | tee "$OUT/log.txt"
timeout 130 python3 -m blockspec.cli bench step --shape qwen3-8b --batches 1,16,64 \
    --output "$OUT/step_qwen3_8b.json" 2>&1 | grep -v -i warn | tee -a "$OUT/log.txt"
timeout 40 python3 -m blockspec.cli bench step --shape bundled --batches 1,16 \
    --output "$OUT/step_bundled.json" 2>&1 | grep -v -i warn | tee -a "$OUT/log.txt"
timeout 120 python3 bench/bundled_gpu.py --max-tokens 128 --no-eager --compare-overlap \
    --output "$OUT/bundled_gpu.json" 2>&1 | tail -8 | tee -a "$OUT/log.txt"
for spec in none dflash; do
  timeout 40 python3 bench/host_overhead.py --device cuda --dtype bfloat16 --real-forward --batch 1 --spec $spec \
      --steps 30 --prefill-lengths 7,13,29,45,77,130 --profile 2>&1 | grep -v -i warn | head -40 | tee -a "$OUT/log.txt"
done

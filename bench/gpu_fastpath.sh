#!/usr/bin/env bash
# One device call: `bench step` timings of the 8B shape (with a kernel profile), the bundled pair's
# tokens/s and greedy equality, the CUDA test files (kernels vs reference, graph replay vs eager,
# fused ops, DDTree's tree kernel), the sampling filters' micro-benchmark, and the exact-law
# lossless tests on the GPU path. JSON and logs land in $OUT.
# Usage on the device machine, from the repo root:  bash bench/gpu_fastpath.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
timeout 240 python3 -m blockspec.cli bench step --shape qwen3-8b --batches 1,16,64 --profile \
    --output "$OUT/step_qwen3_8b.json"
timeout 150 python3 bench/bundled_gpu.py --max-tokens 64 --cpu-reference bench/results/bundled_cpu_reference.json \
    --output "$OUT/bundled_gpu.json"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/engine/test_cuda_graphs.py tests/attention tests/layers \
    2>&1 | tail -15
timeout 60 python3 bench/sampling_filters_gpu.py --rows 1 17 272 --output "$OUT/sampling_filters.json" 2>&1 | tail -25
BLOCKSPEC_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_lossless.py \
    -k matches_exact_law 2>&1 | tail -8

#!/usr/bin/env bash
# One device call (~9 min): `bench step` of the 8B and bundled shapes (graphed kernel profile,
# replay-only device time beside the whole step), the CUDA test files (kernels vs reference,
# graph replay vs eager, fused ops, DDTree's tree kernel), and the bundled pair's tokens/s with
# greedy equality (fast path vs GPU eager reference vs plain vs CPU float32). $OUT gets the JSON.
# Usage on the device machine, from the repo root:  bash bench/gpu_fastpath.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
timeout 230 python3 -m blockspec.cli bench step --shape qwen3-8b --batches 1,16,64 --profile \
    --output "$OUT/step_qwen3_8b.json" 2>&1 | grep -v Warn
timeout 50 python3 -m blockspec.cli bench step --shape bundled --batches 1,16 --profile \
    --output "$OUT/step_bundled.json" 2>&1 | grep -v Warn
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/engine/test_cuda_graphs.py tests/attention tests/layers \
    tests/test_merged_projections.py 2>&1 | tail -6
timeout 150 python3 bench/bundled_gpu.py --max-tokens 64 --cpu-reference bench/results/bundled_cpu_reference.json \
    --output "$OUT/bundled_gpu.json"

#!/usr/bin/env bash
# One device call: where a step's time goes. `bench step` of the 8B and bundled shapes with the
# graphed kernel profile and replay-only times (device time vs the whole step), the bundled
# engine's whole decode step profiled on the host (none / dflash / ddtree, batch 1) and its
# prefill times by prompt length (first call of a shape vs the next), then the CUDA test files.
# Needs the server's wheels carried in .whl (the CLI imports them). JSON and logs land in $OUT.
# Usage (device, repo root): bash bench/gpu_diag.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
timeout 250 python3 -m blockspec.cli bench step --shape qwen3-8b --batches 1,16,64 --profile \
    --output "$OUT/step_qwen3_8b.json" 2>&1 | grep -v Warn
timeout 60 python3 -m blockspec.cli bench step --shape bundled --batches 1,16 --profile \
    --output "$OUT/step_bundled.json" 2>&1 | grep -v Warn
for spec in none dflash ddtree; do
  timeout 50 python3 bench/host_overhead.py --device cuda --dtype bfloat16 --real-forward --batch 1 \
      --spec $spec --steps 30 --profile --prefill-lengths 7,13,29,45,77,130 2>&1 | head -30 | tee -a "$OUT/host_profile.txt"
done
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/engine/test_cuda_graphs.py tests/attention tests/layers \
    tests/test_merged_projections.py 2>&1 | tail -15

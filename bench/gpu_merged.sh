#!/usr/bin/env bash
# One device call (~6 min) after merging the MoE/MLA, quantised-weight and logits-seam work:
# their CUDA tests (MLA kernel, W4A16 kernel, graphed/overlapped/prefill-graphed engine), the
# Kimi-K2 slice step (decode and MLA attention beside their floors), the 8B shape's whole
# decode capture (every bucket to 64).
# Usage on the device machine, from the repo root:  bash bench/gpu_merged.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 140 python3 -m pytest -q -p no:cacheprovider tests/attention/test_triton_mla.py tests/layers/test_w4a16.py \
    tests/engine/test_cuda_graphs.py tests/engine/test_overlap.py tests/engine/test_prefill_graphs.py 2>&1 \
    | tail -15 | tee "$OUT/log.txt"
timeout 150 python3 -m blockspec.cli bench step --shape kimi-k2-slice --batches 1,16,64 \
    --output "$OUT/step_kimi_k2_slice.json" 2>&1 | grep -v -i warn | tee -a "$OUT/log.txt"
timeout 70 python3 -m blockspec.cli bench step --shape qwen3-8b --batches 64 --temperatures 0 --capture-all \
    --output "$OUT/step_qwen3_8b_capture.json" 2>&1 | grep -v -i warn | tee -a "$OUT/log.txt"

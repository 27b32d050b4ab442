#!/usr/bin/env bash
# One device call (~9 min): the CUDA tests of every kernel and the graphed engine on this tree,
# the exact-law lossless tests with the engine on the GPU, the MLA kernel's tiling sweep at
# Kimi's shapes, and the Kimi-K2 slice step (experts hit now counted after graph replays).
# Usage on the device machine, from the repo root:  bash bench/gpu_session_a.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/attention tests/layers tests/engine/test_cuda_graphs.py \
    tests/engine/test_overlap.py tests/engine/test_prefill_graphs.py 2>&1 | tail -15 | tee "$OUT/log.txt"
BLOCKSPEC_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_lossless.py \
    -k matches_exact_law 2>&1 | tail -4 | tee -a "$OUT/log.txt"
timeout 190 python3 bench/mla_tune_gpu.py --budget-s 150 --output "$OUT/mla_tune.json" 2>&1 | grep -v -i warn \
    > "$OUT/mla_tune_log.txt"; grep -E "best|default" "$OUT/mla_tune_log.txt" | tee -a "$OUT/log.txt"
timeout 120 python3 -m blockspec.cli bench step --shape kimi-k2-slice --batches 1,16,64 \
    --output "$OUT/step_kimi_k2_slice.json" 2>&1 | grep -v -i warn | tee -a "$OUT/log.txt"

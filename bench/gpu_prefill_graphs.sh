#!/usr/bin/env bash
# One device call (~7 min): graphed prefills + overlapped decoding on the GPU. The CUDA tests of
# the graphed prefill/decode and overlapped engine and the exact-law lossless tests with the
# engine on the GPU; the bundled pair's tokens/s with and without overlap (ids compared); a warm
# prefill's time and profile; first-prefill times per prompt length (compiles left?).
# Usage on the device machine, from the repo root:  bash bench/gpu_prefill_graphs.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_prefill_graphs.py tests/engine/test_overlap.py \
    tests/engine/test_cuda_graphs.py tests/engine/test_warmup.py 2>&1 | tail -5 | tee "$OUT/log.txt"
BLOCKSPEC_TEST_DEVICE=cuda timeout 130 python3 -m pytest -q -p no:cacheprovider tests/test_lossless.py \
    -k matches_exact_law 2>&1 | tail -4 | tee -a "$OUT/log.txt"
timeout 170 python3 bench/bundled_gpu.py --max-tokens 128 --no-eager --compare-overlap \
    --output "$OUT/bundled_gpu.json" 2>&1 | tail -8 | tee -a "$OUT/log.txt"
timeout 40 python3 bench/prefill_profile.py --spec none --lengths 7,130 2>&1 | grep -v -i warn \
    > "$OUT/prefill_profile.txt"; grep "^prefill" "$OUT/prefill_profile.txt" | tee -a "$OUT/log.txt"
timeout 40 python3 bench/host_overhead.py --device cuda --dtype bfloat16 --real-forward --batch 1 --spec none \
    --steps 30 --prefill-lengths 7,13,29,45,77,130,300 2>&1 | grep -v -i warn | head -3 | tee -a "$OUT/log.txt"

#!/usr/bin/env bash
# Device call 1 of the session (≤ 9.5 min): what last session merged but never ran on the GPU —
#  1. the graphed-engine CUDA tests (graphs incl. adaptive widths, overlap, prefill graphs,
#     batch-invariant engine), tests/layers (W4A16, INT4 experts, fused ops, invariant layers),
#     the invariant attention kernel's tests (its key-block control was changed);
#  2. the exact-law lossless tests with the engine on the GPU;
#  3. `bench step --shape kimi-k2-slice --int4-experts`: the Kimi slice with its routed experts
#     packed INT4 on the W4A16 grouped kernel, as Kimi ships them (issue 14).
# Usage on the device machine, from the repo root:  bash bench/gpu_session_d.sh   (results in $OUT)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
timeout ${TEST_S:-330} python3 -m pytest -q -p no:cacheprovider -rfE --durations=20 --junitxml="$OUT/cuda_tests.xml" \
    tests/engine/test_cuda_graphs.py tests/engine/test_overlap.py tests/engine/test_prefill_graphs.py \
    tests/engine/test_batch_invariant_engine.py tests/layers tests/attention/test_triton_invariant.py \
    tests/test_batch_invariant_sm90.py > "$OUT/cuda_tests_log.txt" 2>&1
tail -40 "$OUT/cuda_tests_log.txt"
BLOCKSPEC_TEST_DEVICE=cuda timeout ${LOSSLESS_S:-60} python3 -m pytest -q -p no:cacheprovider -rfE tests/test_lossless.py \
    -k "matches_exact_law" 2>&1 | tail -5 | tee "$OUT/lossless_log.txt"
timeout ${SLICE_S:-150} python3 -m blockspec.cli bench step --shape kimi-k2-slice --int4-experts --profile \
    --output "$OUT/step_kimi_slice_int4.json" 2>&1 | grep -v -i warn | tee "$OUT/step_kimi_slice_int4.txt"

#!/usr/bin/env bash
# The session's last device call (≤ 9 min): after merging spec_verify 'auto', --batch-invariant,
# adaptive speculation and the MLA defaults —
#  1. the CUDA tests of every kernel and the graphed engine (sampled rows now verified by
#     rejection sampling inside the graphs), the batch-invariant kernels and the adaptive graphs;
#  2. the exact-law lossless tests with the engine on the GPU;
#  3. what --batch-invariant buys and costs (bench/batch_invariant_gpu.sh);
#  4. adaptive against plain, chain 8 and chain 16 at concurrency 1, 4, 16, 64 (bench offline --compare-static).
# Usage on the device machine, from the repo root:  bash bench/gpu_session_c.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.carry/site:$PWD   # .carry/site: bash bench/make_carry.sh --site-only (ShareGPT prompts)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA_TESTS="tests/attention tests/layers tests/engine/test_cuda_graphs.py tests/engine/test_overlap.py
 tests/engine/test_prefill_graphs.py tests/engine/test_batch_invariant_engine.py ${ADAPTIVE_TESTS:-}"
timeout 170 python3 -m pytest -q -p no:cacheprovider $CUDA_TESTS 2>&1 | tail -12 | tee "$OUT/log.txt"
BLOCKSPEC_TEST_DEVICE=cuda timeout 45 python3 -m pytest -q -p no:cacheprovider tests/test_lossless.py \
    -k "matches_exact_law and rejection" 2>&1 | tail -3 | tee -a "$OUT/log.txt"
mkdir -p "$OUT/invariant" "$OUT/adaptive"
OUT=$OUT/invariant SKIP_BUNDLED=1 bash bench/batch_invariant_gpu.sh > "$OUT/invariant/log.txt" 2>&1; tail -5 "$OUT/invariant/log.txt"
timeout 150 python3 -m blockspec.cli bench offline --model blockspec/bundled/target \
    --draft-model blockspec/bundled/drafter --device cuda --dtype bfloat16 --dataset sharegpt --temperature 0 \
    --num-prompts 64 --max-tokens 96 --compare-static --concurrency 1,4,16,64 --static-widths 8 \
    --no-progress --output "$OUT/adaptive/compare_static_gpu.json" > "$OUT/adaptive/log.txt" 2>&1
tail -20 "$OUT/adaptive/log.txt" 2>/dev/null
# At most 8 files come back: the parts' outputs travel as one tar (unpack: tar -xf all.tar).
tar -cf "$OUT/all.tar" -C "$OUT" invariant adaptive && rm -rf "$OUT/invariant" "$OUT/adaptive"

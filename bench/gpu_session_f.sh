#!/usr/bin/env bash
# Seeded sampling by the exponential race on the GPU (≤ 9.5 min a call; .carry from
# `bash bench/make_carry.sh --site-only`, carried). PART=1: the CUDA tests of the race kernel
# and of the graphed engine (its request mix has seeded sampled rows), the kernel's timing
# (bench/race_kernel_gpu.py), `bench offline --compare-static` at T = 1 with every request
# seeded (the race), and the Kimi slice with INT4 experts (issue 14). PART=2: the same
# comparison at T = 1 unseeded and at T = 0.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.carry/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
if [ "${PART:-1}" = 1 ]; then
  timeout ${TEST_S:-140} python3 -m pytest -q -p no:cacheprovider -rfE --junitxml="$OUT/cuda_tests.xml" \
      "tests/test_seeded_sampling.py::test_kernel_equals_the_torch_reference" tests/engine/test_cuda_graphs.py \
      tests/engine/test_overlap.py tests/engine/test_prefill_graphs.py > "$OUT/cuda_tests_log.txt" 2>&1
  tail -15 "$OUT/cuda_tests_log.txt"
  timeout 60 python3 bench/race_kernel_gpu.py --output "$OUT/race_kernel.json" 2>&1 | tail -6
  RUNS=${RUNS:-T1:1} CELL_S=${CELL_S:-240} REPEATS=${REPEATS:-2} bash bench/gpu_session_e.sh
  [ -n "${NO_SLICE:-}" ] || timeout ${SLICE_S:-110} python3 -m blockspec.cli bench step --shape kimi-k2-slice --int4-experts --profile \
      --output "$OUT/step_kimi_slice_int4.json" 2>&1 | grep -v -i warn | tail -20 | tee "$OUT/step_kimi_slice_int4.txt"
else
  RUNS=${RUNS:-T1u:1:u T0:0} CELL_S=${CELL_S:-270} REPEATS=${REPEATS:-2} bash bench/gpu_session_e.sh
fi

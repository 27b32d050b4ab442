#!/usr/bin/env bash
# Tensor parallelism on a multi-GPU kind (nvidia-h200-x2/-x4/-x8), issue 18. Not yet run.
# NVLink multicast stays off (the engine also sets these for every rank).
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
GPUS=$(nvidia-smi -L | wc -l)
SIZES=(); for n in 2 4 8; do [ "$n" -le "$GPUS" ] && SIZES+=("$n"); done
MODEL=${MODEL:-/tmp/qwen3-8b-random}
[ -d "$MODEL" ] || python bench/tp_gpu.py write-qwen3-8b --model "$MODEL"
python bench/tp_gpu.py equal --model "$MODEL" --sizes "${SIZES[@]}"
DEC=(1); for n in 2 4; do [ "$n" -le "$GPUS" ] && DEC+=("$n"); done
python bench/tp_gpu.py decode --model "$MODEL" --sizes "${DEC[@]}"
# The Kimi slice at the widest TP needs `blockspec bench step --tp` (not written yet): see docs/parallelism.md.

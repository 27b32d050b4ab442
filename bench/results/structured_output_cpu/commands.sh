#!/bin/sh
# Structured output on the bundled pair (CPU): results.json, then the unguided ablation.
OMP_NUM_THREADS=1 python bench/structured_output.py --num-prompts 100 --temperatures 0,1 \
    --output bench/results/structured_output_cpu/results.json
OMP_NUM_THREADS=1 python bench/structured_output.py --num-prompts 32 --temperatures 0 --unguided \
    --output bench/results/structured_output_cpu/unguided_t0.json

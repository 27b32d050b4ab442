#!/usr/bin/env bash
# One device call (~4 min): the Kimi-K2 slice step with its expert hits counted in place (the
# capture failed in gpu_session_a), with the kernel profile of each batch; the MLA kernel's
# wide-tile candidates (all 64 heads in one tile over 8-16 warps, longer key steps).
# Usage on the device machine, from the repo root:  bash bench/gpu_session_b.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 200 python3 -m blockspec.cli bench step --shape kimi-k2-slice --batches 1,16,64 --profile \
    --output "$OUT/step_kimi_k2_slice.json" 2>&1 | grep -v -i warn | tee "$OUT/log.txt"
timeout 150 python3 bench/mla_tune_gpu.py --wide --budget-s 100 --output "$OUT/mla_tune_wide.json" 2>&1 \
    | grep -v -i warn > "$OUT/mla_tune_wide_log.txt"; grep -E "best|default" "$OUT/mla_tune_wide_log.txt" | tee -a "$OUT/log.txt"

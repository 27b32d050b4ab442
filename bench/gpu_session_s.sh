#!/usr/bin/env bash
# Device calls of the session of 2026-12-07 (thirteenth). ≤ 9.5 min each.
# PART=1: why adaptive lost a whole round at T = 0, c = 16 in gpu_session_r (0.83 s against
#   0.22 s for its other round): `bench offline --compare-static` at T = 0 (3 rounds after one
#   untimed) now records per round the Triton compiles inside it and its slowest steps; then T = 1
#   unseeded (2 rounds).
# Usage on the device machine, from the repo root:  PART=1 bash bench/gpu_session_s.sh
set -uo pipefail
source bench/device_prelude.sh
show_rounds() {   # each cell's rounds: tok/s, compiles and slowest steps
  python3 - "$1" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for r in doc["records"]:
    print(r["configuration"], r["concurrency"], [round(x) for x in r["tok_s_rounds"]], "compiles", r.get("compiles_rounds"),
          "median step ms", r.get("median_step_ms"), "slowest", r.get("slowest_steps_ms"), r.get("compiled"))
for b, row in doc.get("cost_samples", {}).items():
    print("samples at bucket", b, {w: v[:6] for w, v in row.items()})
print("priors (ms, bucket/width/variant):", {k: v for k, v in doc.get("cost_priors_ms", {}).items() if "/greedy" in k or "/sampled" in k})
PY
}
if [ "${PART:-1}" = 1 ]; then
  if grep -q H200 "$OUT/device.txt"; then   # issue 14 asks its Kimi-slice figure on this card
    timeout $(cap ${SLICE_S:-120}) python3 -m blockspec.cli bench step --shape kimi-k2-slice --int4-experts --profile \
        --output "$OUT/step_kimi_slice_int4_h200.json" 2>&1 | grep -v -i warn | tail -14 | tee "$OUT/step_kimi_slice_int4_h200.txt"
  fi
  WARMUP_ROUNDS=1 compare_static "${T0_RUN:-T0:0::3}" 260
  show_rounds "$OUT/compare_static_gpu_T0.json"
  # Quiet plain stretches now last until a due re-timing can run (full choices on 53 % of steps in
  # gpu_session_r's c = 1, T = 1 run).
  timeout $(cap 45) python3 bench/policy_live_time.py --device cuda --dtype bfloat16 --concurrency 1 --temperature 1 \
      --split --prompts 16 --max-tokens 128 2>&1 | grep -v -i "warn\|token indices" | tail -1 | tee -a "$OUT/policy_live_time.txt"
  # The acceptance model's per-row Python path up to 16 rows against numpy's above 6 (cold caches
  # made numpy's observe of 16 rows 206 µs on the CPU, a Python prototype 74).
  for SR in "" "--scalar-rows 16"; do
    timeout $(cap 45) python3 bench/policy_live_time.py --device cuda --dtype bfloat16 --concurrency 16 --temperature 0 \
        --split --prompts 64 --max-tokens 128 $SR 2>&1 | grep -v -i "warn\|token indices" | tail -1 | tee -a "$OUT/policy_live_time.txt"
  done
  WARMUP_ROUNDS=1 compare_static "T1u:1:u:2" 190
  show_rounds "$OUT/compare_static_gpu_T1u.json"
  rm -f "$OUT"/*.png
fi
echo "script seconds: $SECONDS"

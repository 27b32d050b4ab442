#!/usr/bin/env bash
# Device calls prepared in the session of 2026-12-07 (thirteenth) for the next one. ≤ 9.5 min each.
# PART=1: on an H200 the Kimi slice first (issue 14); the policy's host time inside a run at
#   c = 16, T = 0 and c = 1, T = 1 (speculative quiet stretches, SPEC_QUIET_STEPS 4: not yet measured
#   on a GPU; gpu_session_s measured 338 µs a step at c = 16 before them); `bench offline
#   --compare-static` at T = 0 (3 rounds after one untimed; each round's compiles, median and
#   slowest steps, the cost samples and GPU priors are in the JSON) and T = 1 unseeded (2 rounds).
# PART=3 (≤ 4 min): the two policy_live_time runs and compare-static at T = 0 with 2 rounds.
# Usage on the device machine, from the repo root:  PART=1 bash bench/gpu_session_t.sh
set -uo pipefail
source bench/device_prelude.sh
show_rounds() {   # each cell's rounds: tok/s, compiles, median and slowest steps; the cost samples
  python3 - "$1" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for r in doc["records"]:
    print(r["configuration"], r["concurrency"], [round(x) for x in r["tok_s_rounds"]], "compiles", r.get("compiles_rounds"),
          "median step ms", r.get("median_step_ms"), "slowest", r.get("slowest_steps_ms"), r.get("compiled"))
for b, row in doc.get("cost_samples", {}).items():
    print("samples at bucket", b, {w: v[:6] for w, v in row.items()})
PY
}
live_time() {   # C T PROMPTS
  timeout $(cap 45) python3 bench/policy_live_time.py --device cuda --dtype bfloat16 --concurrency $1 --temperature $2 \
      --split --prompts $3 --max-tokens 128 2>&1 | grep -v -i "warn\|token indices" | tail -1 | tee -a "$OUT/policy_live_time.txt"
}
if grep -q H200 "$OUT/device.txt" && [ "${PART:-1}" = 1 ]; then   # issue 14 asks its Kimi-slice figure on this card
  timeout $(cap ${SLICE_S:-120}) python3 -m blockspec.cli bench step --shape kimi-k2-slice --int4-experts --profile \
      --output "$OUT/step_kimi_slice_int4_h200.json" 2>&1 | grep -v -i warn | tail -14 | tee "$OUT/step_kimi_slice_int4_h200.txt"
fi
live_time 16 0 64
live_time 1 1 16
if [ "${PART:-1}" = 1 ]; then
  WARMUP_ROUNDS=1 compare_static "T0:0::3" 260
  show_rounds "$OUT/compare_static_gpu_T0.json"
  WARMUP_ROUNDS=1 compare_static "T1u:1:u:2" 190
  [ -f "$OUT/compare_static_gpu_T1u.json" ] && show_rounds "$OUT/compare_static_gpu_T1u.json"
else
  WARMUP_ROUNDS=1 compare_static "T0:0::2" 170
  show_rounds "$OUT/compare_static_gpu_T0.json"
fi
rm -f "$OUT"/*.png
echo "script seconds: $SECONDS"

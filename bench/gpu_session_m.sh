#!/usr/bin/env bash
# Device call of the session of 2026-12-07 (ninth), ≤ 9.5 min on whatever card comes. Issue 15 after
# plain stretches relax in closed form (engine/acceptance.py): the two GPU-only tests that `make test`
# skips, then steady steps at fixed batches (the plain engine, the speculative engine held at width 1
# and 16, the free adaptive policy; T = 1 unseeded, kernel time per step), then `bench offline
# --compare-static` at T = 1 unseeded, c = 1 / 16 / 64, three rounds. On an H200, the Kimi slice
# first (issue 14: its figure is asked on that card).
# Usage on the device machine, from the repo root:  bash bench/gpu_session_m.sh
set -uo pipefail
source bench/device_prelude.sh
if grep -q H200 "$OUT/device.txt"; then
  timeout $(cap ${SLICE_S:-150}) python3 -m blockspec.cli bench step --shape kimi-k2-slice --int4-experts --profile \
      --output "$OUT/step_kimi_slice_int4_h200.json" 2>&1 | grep -v -i warn | tail -14
fi
timeout $(cap ${TEST_S:-60}) python3 -m pytest -q -p no:cacheprovider -rfEs \
    "tests/engine/test_deferred_context.py" "tests/layers/test_triton_ops.py::test_the_running_torchs_cuda_order_is_modelled" \
    > "$OUT/cuda_tests_log.txt" 2>&1
tail -2 "$OUT/cuda_tests_log.txt"
timeout $(cap ${STEADY_S:-160}) python3 bench/steady_steps.py --device cuda --dtype bfloat16 --batches 1,16,64 \
    --widths 1,4,16 --rounds 2 --profile --output "$OUT/steady_steps_T1.json" 2>&1 | grep -v -i "warn\|graph replay" \
    | tee "$OUT/steady_steps_T1_log.txt" | tail -12
if [ "$(left)" -gt 120 ]; then
  timeout $(cap 330) python3 -m blockspec.cli bench offline --model blockspec/bundled/target \
      --draft-model blockspec/bundled/drafter --device cuda --dtype bfloat16 --dataset sharegpt --temperature 1 \
      --num-prompts 32 --max-tokens 128 --compare-static --static-widths 4,16 --concurrency 1,16,64 \
      --repeats ${REPEATS:-3} --waves 4 --unseeded --no-progress --output "$OUT/compare_static_gpu_T1u.json" > /tmp/log_cs.txt 2>&1
  grep -v -i "warn\|token indices" /tmp/log_cs.txt | tail -9
fi
rm -f "$OUT"/*.png
echo "script seconds: $SECONDS"

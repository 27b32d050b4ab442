#!/usr/bin/env bash
# One device call (≤ 4 min on one H200; the parts' timeouts sum to 225 s): what --batch-invariant
# buys and costs.
#  1. greedy speculative ≡ plain (bf16, batch 16, 16 prompts), with and without the flag:
#     the bundled pair (graphed, 64 tokens) and the random Qwen3-8B shape (eager, 32 tokens)
#     → $OUT/equality.json (bench/batch_invariant_gpu.py);
#  2. `bench step` of the 8B and bundled shapes with and without the flag (graphed decode at
#     batch 1 and 16, verify of a 16-chain and a 32-tree, DFlash/DDTree steps)
#     → $OUT/step_{8b,bundled}{,_invariant}.json, and the per-figure ratios → $OUT/summary.json.
# Usage on the device machine, from the repo root:  bash bench/batch_invariant_gpu.sh  (SKIP_BUNDLED=1: the 8B steps only)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
# The acceptance item first: its JSON is rewritten after each model and flag, so a timeout keeps the rest.
timeout 110 python3 bench/batch_invariant_gpu.py --output "$OUT/equality.json" 2>&1 | grep -v Warn
STEP="python3 -m blockspec.cli bench step --temperatures 0 --trees 32 --iters 10"
timeout 45 $STEP --shape qwen3-8b --batches 1,16 --output "$OUT/step_8b.json" 2>&1 | grep -v Warn
timeout 50 $STEP --shape qwen3-8b --batches 1,16 --batch-invariant --output "$OUT/step_8b_invariant.json" 2>&1 | grep -v Warn
[ "${SKIP_BUNDLED:-0}" = 1 ] || timeout 15 $STEP --shape bundled --batches 1 --output "$OUT/step_bundled.json" 2>&1 | grep -v Warn
[ "${SKIP_BUNDLED:-0}" = 1 ] || timeout 15 $STEP --shape bundled --batches 1 --batch-invariant --output "$OUT/step_bundled_invariant.json" 2>&1 | grep -v Warn
python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1]); summary = {}
for shape in ("8b", "bundled"):
    try:
        base, inv = (json.loads((out / f"step_{shape}{s}.json").read_text()) for s in ("", "_invariant"))
    except FileNotFoundError as e:
        summary[shape] = f"missing: {e.filename}"; continue
    ms = {(f["name"], f["batch"]): f for f in base["figures"]}
    summary[shape] = {f"{f['name']} batch {f['batch']}": {
        "ms": ms[(f["name"], f["batch"])]["ms"], "ms_invariant": f["ms"],
        "ratio": f["ms"] / ms[(f["name"], f["batch"])]["ms"],
        "replay_ratio": (f["replay_ms"] / ms[(f["name"], f["batch"])]["replay_ms"]
                         if f.get("replay_ms") and ms[(f["name"], f["batch"])].get("replay_ms") else None)}
        for f in inv["figures"] if (f["name"], f["batch"]) in ms}
try:
    summary["equality"] = json.loads((out / "equality.json").read_text())
except FileNotFoundError:
    summary["equality"] = "missing"
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=1))
PY

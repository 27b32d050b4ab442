#!/bin/bash
# Acceptance of the four verification methods on the bundled pair (CPU).
cd /work/main
OUT=bench/results/sampled_tree_cpu
COMMON="--target blockspec/bundled/target --drafter 0=blockspec/bundled/drafter --datasets sharegpt --num-prompts 32 --max-tokens 128"
run() { name=$1; shift; [ -f $OUT/$name.json ] && [ -z "$FORCE" ] && return; echo "== $name"; OMP_NUM_THREADS=1 /usr/bin/time -f "%e s" .venv/bin/python -m blockspec.bench.acceptance $COMMON "$@" --output $OUT/$name.json; }
for setting in "t1:--temperatures 1" "t06_topp095:--temperatures 0.6 --top-p 0.95"; do
  tag=${setting%%:*}; args=${setting#*:}
  run chain_target_only_$tag --spec dflash $args
  run chain_rejection_$tag --spec dflash --spec-verify rejection $args
  run tree16_target_only_$tag --spec ddtree --budget 16 $args
  run tree16_sampled_$tag --spec ddtree --budget 16 --spec-verify rejection $args
done
run tree16_target_only_t0 --spec ddtree --budget 16 --temperatures 0
run tree16_sampled_t0 --spec ddtree --budget 16 --spec-verify rejection --temperatures 0
run tree64_sampled_t1 --spec ddtree --budget 64 --spec-verify rejection --temperatures 1
run tree64_target_only_t1 --spec ddtree --budget 64 --temperatures 1
# 64 held-out prompts (the count), DDTree-64 sampled, T = 1 and T = 0.6 top_p 0.95:
COMMON64="--target blockspec/bundled/target --drafter 0=blockspec/bundled/drafter --datasets sharegpt --num-prompts 64 --max-tokens 128"
[ -f $OUT/tree64_sampled_t1_64prompts.json ] || OMP_NUM_THREADS=1 .venv/bin/python -m blockspec.bench.acceptance $COMMON64 --spec ddtree --budget 64 --spec-verify rejection --temperatures 1 --output $OUT/tree64_sampled_t1_64prompts.json
[ -f $OUT/tree64_sampled_t06_topp095_64prompts.json ] || OMP_NUM_THREADS=1 .venv/bin/python -m blockspec.bench.acceptance $COMMON64 --spec ddtree --budget 64 --spec-verify rejection --temperatures 0.6 --top-p 0.95 --output $OUT/tree64_sampled_t06_topp095_64prompts.json
# Sampled trees draw from q at the row's temperature without its truncation filters (sampling.tempered_probs):
[ -f $OUT/tree64_sampled_t06_topp095_64prompts_tempered_q.json ] || OMP_NUM_THREADS=1 .venv/bin/python -m blockspec.bench.acceptance $COMMON64 --spec ddtree --budget 64 --spec-verify rejection --temperatures 0.6 --top-p 0.95 --output $OUT/tree64_sampled_t06_topp095_64prompts_tempered_q.json
[ -f $OUT/tree128_sampled_t06_topp095_64prompts_tempered_q.json ] || OMP_NUM_THREADS=1 .venv/bin/python -m blockspec.bench.acceptance $COMMON64 --spec ddtree --budget 128 --spec-verify rejection --temperatures 0.6 --top-p 0.95 --output $OUT/tree128_sampled_t06_topp095_64prompts_tempered_q.json
[ -f $OUT/tree16_sampled_t06_topp095_tempered_q.json ] || OMP_NUM_THREADS=1 .venv/bin/python -m blockspec.bench.acceptance $COMMON --spec ddtree --budget 16 --spec-verify rejection --temperatures 0.6 --top-p 0.95 --output $OUT/tree16_sampled_t06_topp095_tempered_q.json
[ -f $OUT/tree128_target_only_t06_topp095_64prompts.json ] || OMP_NUM_THREADS=1 .venv/bin/python -m blockspec.bench.acceptance $COMMON64 --spec ddtree --budget 128 --temperatures 0.6 --top-p 0.95 --output $OUT/tree128_target_only_t06_topp095_64prompts.json

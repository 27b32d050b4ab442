cd /work/main
for R in 1 2; do for MRR in 1 16; do for T in 0 1; do for SPEC in dflash ddtree; do
  OMP_NUM_THREADS=1 .venv/bin/python -m blockspec.cli bench offline --model blockspec/bundled/target --draft-model blockspec/bundled/drafter --spec $SPEC --dataset sharegpt --num-prompts 16 \
    --max-tokens 96 --temperature $T --batch-size $MRR --no-progress --output bench/results/ddtree_vs_dflash_cpu/${SPEC}_b${MRR}_T${T}_r$R.json > bench/results/ddtree_vs_dflash_cpu/${SPEC}_b${MRR}_T${T}_r$R.log 2>&1
done; done; done; done
echo finished > bench/results/ddtree_vs_dflash_cpu/done

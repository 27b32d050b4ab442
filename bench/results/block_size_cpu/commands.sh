cd /work/main
for BS in 4 8 16; do for T in 0 1; do
OMP_NUM_THREADS=1 .venv/bin/python -m blockspec.bench.acceptance --target blockspec/bundled/target --drafter 0=blockspec/bundled/drafter \
  --datasets sharegpt --num-prompts 32 --max-tokens 96 --spec dflash --block-size $BS --temperatures $T --batch 16 --output /tmp/blk/bs${BS}_T$T.json > /tmp/blk/bs${BS}_T$T.log 2>&1
done; done
echo done > /tmp/blk/done

#!/usr/bin/env bash
# Session AC, call 7 (kernel alone; carry variants/base.so = main, variants/acq.so = main +
# benchmarks/candidates/acquire-load.patch): the dependency waits acquire with ld.acquire.gpu instead of a relaxed
# poll and fence.acq_rel.gpu, whose MEMBAR.ALL.GPU waits for the SM's own bulk copies in flight (call 6's probe).
# One `benchmarks.ab.interleaved` process per batch, with an A/A control. `bash call7-acquire-load.sh`.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s)
for bl in 1:45 2:45 8:60; do
  b=${bl%%:*}; lim=${bl#*:}
  timeout -k 5 $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds 6 --iters 20 --control --variant base=variants/base.so --variant acq=variants/acq.so \
    --out $res/b$b > $res/b$b.log 2>&1
  echo "b$b rc=$? ($(( $(date +%s) - start )) s)"; cat $res/b$b/table.md 2>/dev/null || tail -3 $res/b$b.log
done
cd $OUT && tar czf r.tgz r && rm -rf r

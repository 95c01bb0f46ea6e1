#!/usr/bin/env bash
# Session I, device call 3 (the machine of call 2, the bundle still installed; main's extension carried):
# stock and megakernel inside vLLM at batch 1, 1K and 32K history.
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 540 python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy \
  --batch-sizes 1 --contexts 1024,32768 --new-tokens 256 --cache-prompts --out $res/sweep-b1 > $res/sweep-b1.log 2>&1
echo "sweep rc=$?"; cat $res/sweep-b1/table.md; tail -5 $res/sweep-b1.log
cd $OUT && tar czf r.tgz r && rm -rf r

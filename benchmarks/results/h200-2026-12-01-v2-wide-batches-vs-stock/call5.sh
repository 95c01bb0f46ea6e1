#!/usr/bin/env bash
# Session I, device call 5 (the machine of call 2, the bundle still installed; main's extension carried):
# stock and megakernel inside vLLM at batch 1, 8K history, routing uniform at random on both sides.
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 185 python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy \
  --batch-sizes 1 --contexts 8192 --uniform-routing --new-tokens 256 --cache-prompts --out $res/sweep-b1-uniform > $res/sweep-b1-uniform.log 2>&1
echo "sweep rc=$?"; cat $res/sweep-b1-uniform/table.md; tail -5 $res/sweep-b1-uniform.log
cd $OUT && tar czf r.tgz r && rm -rf r

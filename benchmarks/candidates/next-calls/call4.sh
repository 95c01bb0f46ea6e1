#!/usr/bin/env bash
# Session K, device call 4 (same machine as call 3, bundle installed there; main's extension carried): #12's
# grid with --uniform-routing on both sides at batch 2, 4, 8 (the row-keyed draw; batch 1 was measured in
# session J).
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 540 python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy --uniform-routing \
  --batch-sizes 8,2,4 --contexts 8192 --new-tokens 256 --cache-prompts --out $res/sweep-uniform > $res/sweep-uniform.log 2>&1
echo "sweep rc=$?"; cat $res/sweep-uniform/table.md
cd $OUT && tar czf r.tgz r && rm -rf r

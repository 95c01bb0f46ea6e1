#!/usr/bin/env bash
# Session L, device call 3 (same machine as call 2, bundle installed there; main's extension and the bundle's
# install.sh, env.sh, bundle.sha256 carried): inside vLLM at 8K, batch 1 and 8 (batch 1's task sizes landed in
# session J and never measured inside vLLM), then #12's grid with --uniform-routing on both sides at batch 2,
# 4, 8 (the row-keyed draw), as far as the time limit goes.
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 250 python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy \
  --batch-sizes 1,8 --contexts 8192 --new-tokens 256 --cache-prompts --out $res/sweep > $res/sweep.log 2>&1
echo "sweep rc=$?"; cat $res/sweep/table.md
timeout 300 python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy --uniform-routing \
  --batch-sizes 8,2,4 --contexts 8192 --new-tokens 256 --cache-prompts --out $res/sweep-uniform > $res/sweep-uniform.log 2>&1
echo "uniform sweep rc=$?"; cat $res/sweep-uniform/table.md
cd $OUT && tar czf r.tgz r && rm -rf r

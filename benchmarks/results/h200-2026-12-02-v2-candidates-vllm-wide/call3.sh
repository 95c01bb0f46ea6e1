#!/usr/bin/env bash
# Session L, device call 3 (same machine as call 2, bundle installed there; main's extension and the bundle's
# install.sh, env.sh, bundle.sha256 carried): inside vLLM at 8K, batch 1 (session J's batch-1 task sizes, never
# measured inside vLLM), in the device time left (the planned batch 8 and uniform-routing grid did not fit).
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 215 python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy \
  --batch-sizes 1 --contexts 8192 --new-tokens 256 --cache-prompts --out $res/sweep > $res/sweep.log 2>&1
echo "sweep rc=$?"; cat $res/sweep/table.md
cd $OUT && tar czf r.tgz r && rm -rf r

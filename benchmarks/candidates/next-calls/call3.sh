#!/usr/bin/env bash
# Session M, device call 3 (same machine as call 2, bundle installed there; the same carry): inside vLLM at 8K,
# batch 1 and 8 on the current kernel (batch 1's task sizes from session J were never measured inside vLLM).
# Give it at least ~300 s: session L's call with 235 s lost the megakernel side while its engine started.
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 560 python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy \
  --batch-sizes 1,8 --contexts 8192 --new-tokens 256 --cache-prompts --out $res/sweep > $res/sweep.log 2>&1
echo "sweep rc=$?"; cat $res/sweep/table.md
cd $OUT && tar czf r.tgz r && rm -rf r

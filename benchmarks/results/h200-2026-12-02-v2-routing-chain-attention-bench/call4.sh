#!/usr/bin/env bash
# Session J (2026-12-02), device call 4 (same machine as call 2, bundle installed there; kernel cefae60): stock
# and megakernel inside vLLM with uniform routing on both sides, batch 1 and 8, 8K.
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 400 python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy --uniform-routing \
  --batch-sizes 1,8 --contexts 8192 --new-tokens 256 --cache-prompts --out $res/sweep-uniform > $res/sweep-uniform.log 2>&1
echo "sweep rc=$?"; cat $res/sweep-uniform/table.md; tail -5 $res/sweep-uniform.log
cd $OUT && tar czf r.tgz r && rm -rf r

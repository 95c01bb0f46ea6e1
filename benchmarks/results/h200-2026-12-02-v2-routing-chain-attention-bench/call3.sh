#!/usr/bin/env bash
# Session J (2026-12-02), device call 3 (same machine as call 2, bundle installed there): the attention wave
# alone against vLLM's FlashAttention 3 decode on the same paged cache (#11), the default grid.
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 400 python -m benchmarks.attention_bench --model configs/north-mini-code --long-context 262144 \
  --out $res/attention > $res/attention.log 2>&1
echo "attention rc=$?"; cat $res/attention/*.md 2>/dev/null | head -60; tail -15 $res/attention.log
cd $OUT && tar czf r.tgz r && rm -rf r

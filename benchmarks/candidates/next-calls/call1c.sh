#!/usr/bin/env bash
# Next session, device call 1c (same machine; carry main's extension): the head of the layer at batch 64, 32 and 16,
# kernel alone, main, one process per batch (PERF_LOG #77-#80): at 64 against its default (the combine folded into
# the norm, QKV tiles in two 32-row slices) four 16-row slices (the register form) or three, 32-row O tasks, and
# O tiles in 16-row slices (o_batch_split, ABI 11); at 32 and 16 the fold and the splits, not yet their default.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
run() {
  timeout $(( 590 - ($(date +%s) - start) )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
    --batch-sizes $1 --iters 5 --schedules "$2" --out $res/b$1 > $res/b$1.log 2>&1
  echo "batch $1 rc=$? ($(( $(date +%s) - start )) s)"; grep -h "us per step" $res/b$1.log
}
run 64 "default;qkv_batch_split=4;qkv_batch_split=3;o_rows=32;o_batch_split=4,o_rows=32;o_batch_split=4;default"
run 32 "default;combine_in_norm=1;combine_in_norm=1,qkv_batch_split=2;combine_in_norm=1,qkv_batch_split=2,qkv_rows=80;o_batch_split=2"
run 16 "default;combine_in_norm=1,qkv_batch_split=2"
cd $OUT && tar czf r.tgz r && rm -rf r

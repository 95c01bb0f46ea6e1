#!/usr/bin/env bash
# Next session, device call 1c (run it first, on a fresh machine; carry main's extension, ABI 11): main's kernel
# tests (the O projection's batch-row slices, o_batch_split, never ran on a GPU), then the head of the layer and
# the O projection at batch 64 and 32, kernel alone, one process per batch (PERF_LOG #77-#80): at 64 against its
# default (the combine folded into the norm, QKV tiles in two 32-row slices) QKV tiles in four 16-row slices (the
# register form), O tiles of 32 rows in four 16-row slices, both, and 32-row O tasks unsplit; at 32 the fold
# and the splits, not yet its default.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 110 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
  tests/gpu/test_each_opcode.py > $res/tests-main.txt 2>&1; echo "main tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-main.txt
run() {
  timeout $(( 590 - ($(date +%s) - start) )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
    --batch-sizes $1 --iters 5 --schedules "$2" --out $res/b$1 > $res/b$1.log 2>&1
  echo "batch $1 rc=$? ($(( $(date +%s) - start )) s)"; grep -h "us per step" $res/b$1.log
}
run 64 "default;qkv_batch_split=4;o_batch_split=4,o_rows=32;qkv_batch_split=4,o_batch_split=4,o_rows=32;o_rows=32;default"
run 32 "default;combine_in_norm=1;combine_in_norm=1,qkv_batch_split=2;combine_in_norm=1,qkv_batch_split=2,o_batch_split=2"
cd $OUT && tar czf r.tgz r && rm -rf r

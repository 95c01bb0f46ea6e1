#!/usr/bin/env bash
# Session J (2026-12-02), device call 5 (a fresh machine; main's extension carried):
# PERF_LOG #51, the confirmation of #50: QKV and router task sizes
# at batch 1, 2, 4 and 8 in one process, and batch 1-2 again, schedules in the other order, in a second.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
timeout 150 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,2,4,8 --iters 20 \
  --schedules "default;qkv_rows=64,router_rows=8;router_rows=8;qkv_rows=64" --out $res/confirm-1 > $res/confirm-1.log 2>&1
echo "confirm-1 rc=$?"
timeout 70 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,2 --iters 20 \
  --schedules "qkv_rows=64;router_rows=8;qkv_rows=64,router_rows=8;default" --out $res/confirm-2 > $res/confirm-2.log 2>&1
echo "confirm-2 rc=$?"
grep -h "us per step" $res/confirm-1.log $res/confirm-2.log
cd $OUT && tar czf r.tgz r && rm -rf r

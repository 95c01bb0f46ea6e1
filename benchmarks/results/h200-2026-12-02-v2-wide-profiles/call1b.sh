#!/usr/bin/env bash
# Session K, the call right after call 1 (same machine; main's extension carried): batch 1's attention sized
# by work at 8K (PERF_LOG #57), one process. Run exactly as this one command line:
export PYTHONPATH=$PWD; mkdir -p $OUT/r; timeout 80 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1 --iters 20 --context 8192 --schedules "default;attn_min_tiles=8;attn_min_tiles=15;attn_min_tiles=16;attn_splits=32;default" --out $OUT/r/b1-splits-8192 > $OUT/r/b1-splits-8192.log 2>&1; echo rc=$?; grep -h "us per step" $OUT/r/*.log

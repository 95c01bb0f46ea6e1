#!/usr/bin/env bash
# Session J (2026-12-02), device call 2 (after four calls of `bash .offline-bundle/install.sh --stash
# .offline-bundle/pN`, N = 0..3, on the same machine; main's extension carried, kernel cefae60 = warpgroup
# registers): the bundle installed with this checkout as the plugin, then stock and megakernel inside vLLM at
# batch 1, 8, 16 and 32, 8K.
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
timeout 540 python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy \
  --batch-sizes 1,8,16,32 --contexts 8192 --new-tokens 256 --cache-prompts --out $res/sweep > $res/sweep.log 2>&1
echo "sweep rc=$?"; cat $res/sweep/table.md; tail -5 $res/sweep.log
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session K, device call 2 (same machine as call 1; main's extension carried): batch 8's attention splits in
# the whole step (17, the default, against 16: 136 against 128 partial tasks), twice; then batch 32 and 64
# profiled each in its own process (#10 asks batch 64's per-wave bandwidth; session J's batch 64 did not
# finish inside 60 s behind batch 32); then batch 1's default in three fresh processes, two placements each
# (is batch 1's 2566-2860 us spread between processes in session J a per-process effect?); then batch 1's
# attention sized by work (attn_min_tiles: a full 8K layer's 513 tiles make 35 splits of 15 or 33 of 16, 128K keeps
# 128), at 8K and 128K. Predictions: PERF_LOG #57-#59.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
timeout 90 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 8 --iters 20 \
  --schedules "default;attn_splits=16;default;attn_splits=16" --out $res/splits8 > $res/splits8.log 2>&1; echo "splits8 rc=$?"
timeout 80 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 32 --iters 5 \
  --out $res/b32 > $res/b32.log 2>&1; echo "b32 rc=$?"
timeout 120 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 64 --iters 5 \
  --out $res/b64 > $res/b64.log 2>&1; echo "b64 rc=$?"
for i in 1 2 3; do
  timeout 45 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1 --iters 20 \
    --placements 2 --out $res/b1-process-$i > $res/b1-process-$i.log 2>&1; echo "b1 process $i rc=$?"
done
for ctx in 8192 131072; do
  timeout $([ $ctx = 8192 ] && echo 60 || echo 120) python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1 --iters 20 \
    --context $ctx --schedules "default;attn_min_tiles=8;attn_min_tiles=15;attn_min_tiles=16;attn_splits=32;default" \
    --out $res/b1-splits-$ctx > $res/b1-splits-$ctx.log 2>&1; echo "b1 splits $ctx rc=$?"
done
grep -h "us per step" $res/*.log
cd $OUT && tar czf r.tgz r && rm -rf r

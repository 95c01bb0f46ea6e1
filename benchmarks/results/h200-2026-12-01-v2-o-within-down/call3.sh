#!/usr/bin/env bash
# Session G, device call 3 (main's extension): attention splits at batch 8 and 16 (ceil(132 / batch) gives
# 136 and 144 attention tasks for 132 SMs), alone and with o_within_down=0.7.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
timeout 200 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 16 --iters 20 --out $res/b16 \
  --schedules "default;o_within_down=0.7;attn_splits=8;attn_splits=6;attn_splits=4;attn_splits=8,o_within_down=0.7;attn_splits=6,o_within_down=0.7" \
  > $res/b16.log 2>&1; echo "b16 rc=$?"
timeout 150 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 8 --iters 20 --out $res/b8 \
  --schedules "default;o_within_down=0.7;attn_splits=16;attn_splits=12;attn_splits=8;attn_splits=16,o_within_down=0.7" \
  > $res/b8.log 2>&1; echo "b8 rc=$?"
grep -h "per step" $res/*.log
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session J (2026-12-02), device call 1 (from the checkout's root; main's extension and variants/ carried, variants/ built by
# `benchmarks/ab/build.sh variants base pf=benchmarks/candidates/attention-l2-prefetch.patch`): kernel tests,
# memcheck and synccheck on pf; the A/B base / pf twice; batch 1 on three placements with traces; tile sizes
# at batch 1-2; batch 32 and 64 profiled.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so; cp variants/pf.so $so
timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
  > $res/tests-pf.txt 2>&1; echo "pf tests rc=$?"; tail -1 $res/tests-pf.txt
timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_sanitizer.py -k "memcheck or synccheck" \
  > $res/sanitizer-pf.txt 2>&1; echo "pf sanitizer rc=$?"; tail -1 $res/sanitizer-pf.txt
cp /tmp/main.so $so
timeout 240 bash benchmarks/ab/run.sh variants $res/ab 1,2,4,8,16 base pf base pf > $res/ab.log 2>&1; echo "ab rc=$?"
timeout 90 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1 --iters 20 \
  --placements 3 --save-traces --out $res/placements > $res/placements.log 2>&1; echo "placements rc=$?"
timeout 70 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,2 --iters 20 \
  --schedules "default;moe_up_cols=48;moe_up_cols=24;qkv_rows=64,router_rows=8" --out $res/tiles > $res/tiles.log 2>&1
echo "tiles rc=$?"
timeout 60 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 32,64 --iters 10 \
  --out $res/wide > $res/wide.log 2>&1; echo "wide rc=$?"
grep -h "us per step" $res/placements.log $res/tiles.log $res/wide.log
tail -8 $res/ab.log
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session I, device call 1 (from the checkout's root; main's extension and variants/ carried, variants/ built by
# `benchmarks/ab/build.sh variants base wgr=benchmarks/candidates/warpgroup-registers.patch
#  wgrc=benchmarks/candidates/warpgroup-registers.patch,benchmarks/candidates/combine-staged-rounds.patch`):
# kernel tests, memcheck and synccheck on wgr and wgrc, the A/B base / wgr / wgrc twice, and two wave orders at
# batch 1-2 on main.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
for v in wgr wgrc; do
  cp variants/$v.so $so
  timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
    > $res/tests-$v.txt 2>&1; echo "$v tests rc=$?"; tail -1 $res/tests-$v.txt
  timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_sanitizer.py -k "memcheck or synccheck" \
    > $res/sanitizer-$v.txt 2>&1; echo "$v sanitizer rc=$?"; tail -1 $res/sanitizer-$v.txt
done
cp /tmp/main.so $so
timeout 240 bash benchmarks/ab/run.sh variants $res/ab 1,2,4,8,16 base wgr wgrc base wgr wgrc > $res/ab.log 2>&1
echo "ab rc=$?"
timeout 50 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,2 --iters 20 \
  --schedules "default;order=combine_before_experts" --out $res/orders > $res/orders.log 2>&1; echo "orders rc=$?"
grep "us per step" $res/orders.log
tail -14 $res/ab.log
cd $OUT && tar czf r.tgz r && rm -rf r

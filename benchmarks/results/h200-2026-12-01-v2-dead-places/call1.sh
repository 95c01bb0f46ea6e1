#!/usr/bin/env bash
# Session H, device call 1 (from the checkout's root; main's extension and variants/ carried, variants/ built by
# `benchmarks/ab/build.sh variants base cdp=benchmarks/candidates/cheap-dead-places.patch`; combo/ carried: main
# with both candidates applied, its own extension built on the CPU machine): the A/B of cheap-dead-places, the
# kernel tests and sanitizers on it, then from combo/ its kernel tests (the uneven-tile test included) and the
# uneven down tiles against the default tile at batch 8 and 16.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
timeout 200 bash benchmarks/ab/run.sh variants $res/ab 1,2,4,8,16 base cdp base cdp > $res/ab.log 2>&1
echo "ab rc=$?"; tail -12 $res/ab.log
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so; cp variants/cdp.so $so
timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
  > $res/tests-cdp.txt 2>&1; echo "cdp tests rc=$?"; tail -1 $res/tests-cdp.txt
timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_sanitizer.py -k "memcheck or synccheck" \
  > $res/sanitizer-cdp.txt 2>&1; echo "cdp sanitizer rc=$?"; tail -1 $res/sanitizer-cdp.txt
cp /tmp/main.so $so
cd combo && export PYTHONPATH=$PWD
timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
  > $res/tests-combo.txt 2>&1; echo "combo tests rc=$?"; tail -1 $res/tests-combo.txt
for r in 1 2; do
  timeout 60 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 8 --iters 20 \
    --schedules "default;moe_down_rows=192" --out $res/combo-b8-$r > $res/combo-b8-$r.log 2>&1; echo "combo b8 rc=$?"
  timeout 60 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 16 --iters 20 \
    --schedules "default;moe_down_rows=96" --out $res/combo-b16-$r > $res/combo-b16-$r.log 2>&1; echo "combo b16 rc=$?"
done
for f in $res/combo-b*.log; do echo "== $f"; grep "us per step" $f; done
cd $OUT && tar czf r.tgz r && rm -rf r

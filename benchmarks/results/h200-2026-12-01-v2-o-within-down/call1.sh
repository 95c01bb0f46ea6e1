#!/usr/bin/env bash
# Session G, device call 1 (from the checkout's root, main's extension carried, variants/ built by
# benchmarks/ab/build.sh on the CPU machine): kernel tests on main (the o_within_down GPU test included),
# main's schedules default vs o_within_down 0.3 / 0.5 / 0.7, the A/B of the two csrc-only candidates, and the
# kernel tests on the variant holding both candidates.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
timeout 150 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
  > $res/tests-main.txt 2>&1; echo "main tests rc=$?"; tail -1 $res/tests-main.txt
timeout 240 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,2,4,8,16 --iters 20 \
  --schedules "default;o_within_down=0.3;o_within_down=0.5;o_within_down=0.7;norm=wave" --out $res/schedules > $res/schedules.log 2>&1
echo "schedules rc=$?"
timeout 230 bash benchmarks/ab/run.sh variants $res/ab 1,2,4,8,16 base prefetch polls both base > $res/ab.log 2>&1
echo "ab rc=$?"
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so; cp variants/both.so $so
timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
  > $res/tests-both.txt 2>&1; echo "both tests rc=$?"; tail -1 $res/tests-both.txt
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

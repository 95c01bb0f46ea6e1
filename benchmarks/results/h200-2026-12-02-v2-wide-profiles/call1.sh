#!/usr/bin/env bash
# Session K, device call 1 (a fresh machine; carry vllm_megakernel/_C*.so = main (variants/base.so) and
# variants/): main's kernel tests (the row-keyed uniform draw, batch 1's new tile sizes) and memcheck /
# synccheck; batch 32 and batch 64 profiled, each in its own process (#10 asks batch 64's per-wave
# bandwidth; #12's batch 32 and 64 lose to stock and no trace of them exists); then the combine candidate's
# kernel tests and sanitizers if time is left.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
tests() {
  timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
    > $res/tests-$1.txt 2>&1; echo "$1 tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-$1.txt
  timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_sanitizer.py -k "memcheck or synccheck" \
    > $res/sanitizer-$1.txt 2>&1; echo "$1 sanitizer rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer-$1.txt
}
tests main
grep -h "uniform" $res/tests-main.txt | head -5
for b in 32 64; do
  timeout $([ $b = 32 ] && echo 100 || echo 160) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
    --batch-sizes $b --iters 5 --out $res/b$b > $res/b$b.log 2>&1; echo "b$b rc=$? ($(( $(date +%s) - start )) s)"
  grep -h "us per step" $res/b$b.log
done
if [ $(( $(date +%s) - start )) -lt 360 ]; then cp variants/cw.so $so; tests cw; cp /tmp/main.so $so; fi
cd $OUT && tar czf r.tgz r && rm -rf r

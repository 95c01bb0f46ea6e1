#!/usr/bin/env bash
# Next session, device call 1 (a fresh machine; carry vllm_megakernel/_C*.so = main, variants/ with base.so, cc.so
# op.so and fa.so): the kernel tests of main and cc under b0e4f45's K/V check (its first GPU run: main must pass it;
# a failure names the layer, row and K / V, or the blocks written outside the new slots), then the A/B
# base / cc / op / fa / base at batch 1, 8, 64 (kernel alone, one process environment) in the time left.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.memory --format=csv > $res/gpu.txt 2>&1
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
for v in main cc; do
  cp variants/$v.so $so 2>/dev/null || cp /tmp/main.so $so
  MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 110 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
    tests/gpu/test_each_opcode.py > $res/tests-$v.txt 2>&1; echo "$v tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-$v.txt
  grep -E "^FAILED|^E  +AssertionError" $res/tests-$v.txt | head -6
done
cp /tmp/main.so $so
timeout $(( 585 - ($(date +%s) - start) )) bash benchmarks/ab/run.sh variants $res/ab 1,8,64 base cc op fa base > $res/ab.log 2>&1
echo "ab rc=$? ($(( $(date +%s) - start )) s)"; tail -10 $res/ab.log
cd $OUT && tar czf r.tgz r && rm -rf r

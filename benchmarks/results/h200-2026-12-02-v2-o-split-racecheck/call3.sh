#!/usr/bin/env bash
# Session N, device call 3 (a fresh machine; carry vllm_megakernel/_C*.so = main, variants/ with base.so and
# ccpf.so): ccpf's kernel tests on this commit's Python defaults (batch 64's O split among them; in call 1 its two
# batch-64 failures were the new K/V check's margin, call 2), then the A/B base / ccpf / ccpf / base at batch
# 1, 8, 64 (kernel alone, one process environment; PERF_LOG #81, #82) in the time left (420 s in all).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
cp variants/ccpf.so $so
MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 110 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
  tests/gpu/test_each_opcode.py > $res/tests-ccpf.txt 2>&1; echo "ccpf tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-ccpf.txt
grep FAILED $res/tests-ccpf.txt
cp /tmp/main.so $so
timeout $(( 420 - ($(date +%s) - start) )) bash benchmarks/ab/run.sh variants $res/ab 1,8,64 base ccpf ccpf base > $res/ab.log 2>&1
echo "ab rc=$? ($(( $(date +%s) - start )) s)"; tail -8 $res/ab.log
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

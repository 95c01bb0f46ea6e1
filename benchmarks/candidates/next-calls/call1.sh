#!/usr/bin/env bash
# Session K, device call 1 (a fresh machine; carry vllm_megakernel/_C*.so = main and variants/ from
# `benchmarks/ab/build.sh variants base cw=benchmarks/candidates/combine-warp-per-head.patch`): main's kernel
# tests (uniform routing keyed on the row, batch 1's new tile sizes) and memcheck/synccheck; the same on cw;
# the A/B base / cw twice at batch 1-32.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
for v in main cw; do
  [ $v = cw ] && cp variants/cw.so $so
  timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
    > $res/tests-$v.txt 2>&1; echo "$v tests rc=$?"; tail -1 $res/tests-$v.txt
  timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_sanitizer.py -k "memcheck or synccheck" \
    > $res/sanitizer-$v.txt 2>&1; echo "$v sanitizer rc=$?"; tail -1 $res/sanitizer-$v.txt
done
grep -h "uniform routing, batch" $res/tests-main.txt
cp /tmp/main.so $so
timeout 330 bash benchmarks/ab/run.sh variants $res/ab 1,2,8,16,32 base cw base cw > $res/ab.log 2>&1; echo "ab rc=$?"
tail -8 $res/ab.log
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session K, device call 2 (carry vllm_megakernel/_C*.so = main and variants/ from `benchmarks/ab/build.sh
# variants base grp=<grouped-held-stages> wide=<grouped-held-stages + topk-rows-prefetched>`): the wide
# variant's kernel tests (test_wide_step at batch 17 and 64 and test_each_opcode's batch-20 waves run the
# grouped GEMM form) and memcheck / synccheck; the A/B base / wide twice at batch 1, 32, 64 (PERF_LOG
# #60-#61); batch 64's combine sizes and batch 32-64 QKV tiles on the wide variant (#62).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
cp variants/wide.so $so
timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
  > $res/tests-wide.txt 2>&1; echo "wide tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-wide.txt
timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_sanitizer.py -k "memcheck or synccheck" \
  > $res/sanitizer-wide.txt 2>&1; echo "wide sanitizer rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer-wide.txt
cp /tmp/main.so $so
timeout 330 bash benchmarks/ab/run.sh variants $res/ab 1,32,64 base wide base wide > $res/ab.log 2>&1
echo "ab rc=$? ($(( $(date +%s) - start )) s)"; tail -8 $res/ab.log
cp variants/wide.so $so
timeout 110 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 32,64 --iters 5 \
  --schedules "default;combine_heads=8;combine_heads=4;qkv_rows=40" --out $res/wide-schedules > $res/wide-schedules.log 2>&1
echo "schedules rc=$? ($(( $(date +%s) - start )) s)"; grep -h "us per step" $res/wide-schedules.log
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session M, device call 1 (a fresh machine; carry vllm_megakernel/_C*.so = main cadfd40 and variants/ with base.so,
# pk.so, prg.so): main's kernel tests (the combine_in_norm step at batch 17 and 64 and the batch-split QKV step
# among them; ABI 10's first GPU run) and memcheck / synccheck; prg's kernel tests; then base and prg at batch 64,
# kernel alone, one process per kernel: each default against the MoE combine folded into the norm
# (combine_in_norm=1) and, on top of the fold, 128 QKV tasks of 80 weight rows x 32 batch rows
# (qkv_batch_split=2); prg also with 128 QKV tasks of 40 weight rows. PERF_LOG #70-#74.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
python3 -c "import vllm_megakernel._C as c; print(c.build_info())" > $res/build-info-main.txt 2>&1
tests() {
  timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
    > $res/tests-$1.txt 2>&1; echo "$1 tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-$1.txt
}
tests main
timeout 60 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_sanitizer.py -k "memcheck or synccheck" \
  > $res/sanitizer-main.txt 2>&1; echo "main sanitizer rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer-main.txt
cp variants/prg.so $so; tests prg
split="combine_in_norm=1,qkv_batch_split=2,qkv_rows=80"
for v in base prg; do
  cp variants/$v.so $so
  sched="default;combine_in_norm=1;$split;default"
  [ $v = prg ] && sched="default;combine_in_norm=1;$split;combine_in_norm=1,qkv_rows=40"
  timeout $(( 590 - ($(date +%s) - start) )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
    --batch-sizes 64 --iters 5 --schedules "$sched" --out $res/$v-64 > $res/$v-64.log 2>&1
  echo "$v batch 64 rc=$? ($(( $(date +%s) - start )) s)"; grep -h "us per step" $res/$v-64.log
done
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session M, device call 1 (a fresh machine; carry vllm_megakernel/_C*.so = main and variants/ with base.so,
# pk.so, prg.so, prgt.so; see ../README.md): main's kernel tests (the combine_in_norm step at batch 17 and 64
# and the batch-split QKV step among them; ABI 10's first GPU run) and memcheck / synccheck; prg's kernel tests
# (its packed GEMM loop is pk's; prgt, prg + the top-k rows side by side, spills in the register GEMM loop every
# expert task runs, so it is not timed); then base against prg at batch 64, each with the MoE combine folded
# into the norm (schedule choice) against its default, prg also with 128 QKV tasks two ways.
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
}
tests main
timeout 60 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_sanitizer.py -k "memcheck or synccheck" \
  > $res/sanitizer-main.txt 2>&1; echo "main sanitizer rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer-main.txt
cp variants/prg.so $so; tests prg
# batch 64 (the one below stock), kernel alone, one process per kernel: main with the MoE combine folded into
# the norm against its default; prg likewise, and on top of the fold 128 QKV tasks either of 40 weight rows
# (5 stages) or of 80 weight rows and 32 batch rows (qkv_batch_split). Batch 32 and 16: call 2's sweep.
for b in 64; do
  for v in base prg; do
    cp variants/$v.so $so
    sched="default;combine_in_norm=1;default"
    [ $v = prg ] && sched="default;combine_in_norm=1;combine_in_norm=1,qkv_rows=40;combine_in_norm=1,qkv_batch_split=2,qkv_rows=80;default"
    timeout $(( 585 - ($(date +%s) - start) )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
      --batch-sizes $b --iters 5 --schedules "$sched" --out $res/$v-$b > $res/$v-$b.log 2>&1
    echo "$v batch $b rc=$? ($(( $(date +%s) - start )) s)"; grep -h "us per step" $res/$v-$b.log
  done
done
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

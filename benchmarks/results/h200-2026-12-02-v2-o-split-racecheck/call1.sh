#!/usr/bin/env bash
# Session N, device call 1 (a fresh machine; carry vllm_megakernel/_C*.so = main at 454dae0, ABI 11, and
# variants/ with ccpf.so): main's kernel tests (ABI 11's O projection batch-row slices never ran on a GPU), the
# kernel tests of ccpf (attn-combine-by-column + attn-combine-prefetch), then batch 64 kernel alone (one process
# per kernel): main's default against QKV in four 16-row slices, O tiles of 32 rows in four 16-row slices, both
# (PERF_LOG #77, #78/#80), and ccpf's default (#81); batch 32 with the fold and the split in the time left (#79).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.memory --format=csv > $res/gpu.txt 2>&1
python3 -c "import vllm_megakernel._C as c; print(c.build_info())" > $res/build-info-main.txt 2>&1
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
tests() {
  MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 110 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
    tests/gpu/test_each_opcode.py > $res/tests-$1.txt 2>&1; echo "$1 tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-$1.txt
}
tests main
cp variants/ccpf.so $so; tests ccpf
profile() {  # kernel name, schedules
  cp variants/$1.so $so 2>/dev/null || cp /tmp/main.so $so
  timeout $(( 590 - ($(date +%s) - start) )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
    --batch-sizes ${batch:-64} --iters 5 --schedules "$2" --out $res/$1-${batch:-64} > $res/$1-${batch:-64}.log 2>&1
  echo "$1 batch ${batch:-64} rc=$? ($(( $(date +%s) - start )) s)"; grep -h "us per step" $res/$1-${batch:-64}.log
}
profile main "default;qkv_batch_split=4;o_batch_split=4,o_rows=32;qkv_batch_split=4,o_batch_split=4,o_rows=32;default"
profile ccpf "default"
batch=32 profile main "default;combine_in_norm=1,qkv_batch_split=2;default"
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

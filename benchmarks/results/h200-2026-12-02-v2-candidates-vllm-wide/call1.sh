#!/usr/bin/env bash
# Session L, device call 1 (a fresh machine; carry vllm_megakernel/_C*.so = main and variants/ with base.so,
# cands.so and abort.so, see ../README.md): main's kernel tests and memcheck / synccheck (the landed grouped
# GEMM stages have run through them only inside session K's variants); cands's (topk-rows-side-by-side + qkv-rows-staged +
# grouped-by-row-group) and abort's (abort-at-filled-position, with its own stalled-barrier cases applied to
# the tests) kernel tests and memcheck / synccheck; abort's new stress test on main's kernel; the head-of-layer
# task sizes at batch 32 and 64 on cands.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
# racecheck's reports on the rings may be the tool's own: later releases than CUDA 13.0's fixed racecheck false
# positives with mbarriers, complete-tx and warp-level syncs (README's "Not yet clean"); which one is here?
(compute-sanitizer --version || /usr/local/cuda/bin/compute-sanitizer --version) > $res/sanitizer-version.txt 2>&1
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
tests() {
  timeout 90 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
    > $res/tests-$1.txt 2>&1; echo "$1 tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-$1.txt
  timeout 60 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_sanitizer.py -k "memcheck or synccheck" \
    > $res/sanitizer-$1.txt 2>&1; echo "$1 sanitizer rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer-$1.txt
}
tests main
cp variants/cands.so $so; tests cands
cp variants/abort.so $so; git apply --include='tests/*' benchmarks/candidates/abort-at-filled-position.patch && tests abort
# the abort patch's new stress test on main's kernel: a hang there (rc 124) is the bug the patch fixes
cp /tmp/main.so $so
timeout 60 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py -k aborts_at_any_moment \
  > $res/abort-stress-on-main.txt 2>&1; echo "abort stress test on main rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/abort-stress-on-main.txt
git apply -R --include='tests/*' benchmarks/candidates/abort-at-filled-position.patch
cp variants/cands.so $so
timeout $(( 570 - ($(date +%s) - start) )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
  --batch-sizes 32,64 --iters 5 --schedules "default;router_rows=8;qkv_rows=40;router_rows=8,qkv_rows=40" \
  --out $res/head-sizes > $res/head-sizes.log 2>&1
echo "head sizes rc=$? ($(( $(date +%s) - start )) s)"; grep -h "us per step" $res/head-sizes.log
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session K, device call 3 (a fresh machine; carry vllm_megakernel/_C*.so = main and variants/ from
# `benchmarks/ab/build.sh variants base grp=<grouped-held-stages> grpk=<grp + top-k scores staged in shared
# memory>`): grpk's kernel tests and memcheck / synccheck; the A/B base / grp / grpk at batch 1, 32, 64
# (PERF_LOG #63); batch 64's combine sizes on grpk (#62; call 2's schedule scan ran out of time there).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
cp variants/grpk.so $so
timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
  > $res/tests-grpk.txt 2>&1; echo "grpk tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-grpk.txt
timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_sanitizer.py -k "memcheck or synccheck" \
  > $res/sanitizer-grpk.txt 2>&1; echo "grpk sanitizer rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer-grpk.txt
cp /tmp/main.so $so
timeout 360 bash benchmarks/ab/run.sh variants $res/ab3 1,32,64 base grp grpk base grpk > $res/ab3.log 2>&1
echo "ab rc=$? ($(( $(date +%s) - start )) s)"; tail -9 $res/ab3.log
cp variants/grpk.so $so
timeout $(( 575 - ($(date +%s) - start) )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 64 --iters 5 \
  --schedules "default;combine_heads=8;default;combine_heads=8" --out $res/b64-combine > $res/b64-combine.log 2>&1
echo "b64 combine rc=$? ($(( $(date +%s) - start )) s)"; grep -h "us per step" $res/b64-combine.log
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

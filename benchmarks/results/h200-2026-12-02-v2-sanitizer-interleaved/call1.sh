#!/usr/bin/env bash
# Next session, device call 1 (a fresh machine; carry vllm_megakernel/_C*.so = main, variants/sw.so (candidate
# producer-descriptor-syncwarp; name the file, not variants/: with every probe built, variants/ and .sanitizer/
# together pass the 64 MiB carry limit) and .sanitizer/ with nvidia-cuda-sanitizer-api 13.5.25 =
# compute-sanitizer 2026.4.0): sw under racecheck on the 2-layer step (session O: main has 0 errors and 9 warp-level
# warnings there, the ones sw's __syncwarp() is for), then tests/gpu/test_sanitizer.py with that compute-sanitizer
# (memcheck, racecheck, synccheck on the 5-layer step with 4500 / 7 / 0 histories: #10's "sanitizer clean"; its
# racecheck has not finished on v2 before), then sw's kernel tests. The timing is call 2's.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s); limit=570
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-2l --seed 1 --num-layers 2 > $res/ckpt.log 2>&1
w=$(ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl); d=/tmp/cs-13.5.25; rm -rf $d; python3 -m zipfile -e $w $d
chmod -R u+x $d/nvidia/cu13; cs=$d/nvidia/cu13/bin/compute-sanitizer
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
cp variants/sw.so $so
timeout 90 $cs --tool racecheck --racecheck-report all --print-limit 20 \
  python3 tests/gpu/sanitize_step.py /tmp/nmc-2l --lengths 300,0 > $res/racecheck-sw-2l.txt 2>&1
echo "sw 2-layer racecheck rc=$? ($(( $(date +%s) - start )) s)"; grep -E "RACECHECK SUMMARY|step ok" $res/racecheck-sw-2l.txt
grep -E "Error: Potential|Warning: " $res/racecheck-sw-2l.txt | sed 's/ at __shared__.*//' | sort | uniq -c
COMPUTE_SANITIZER=$cs MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 300 python3 -m pytest -q -rA -p no:cacheprovider \
  --durations=3 tests/gpu/test_sanitizer.py > $res/sanitizer-sw.txt 2>&1
echo "sw test_sanitizer rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer-sw.txt; grep -E "^(PASSED|FAILED)" $res/sanitizer-sw.txt
MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout $(( limit - ($(date +%s) - start) )) python3 -m pytest -q -rA -p no:cacheprovider \
  tests/gpu/test_each_opcode.py tests/gpu/test_megakernel_step.py > $res/tests-sw.txt 2>&1
echo "sw tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-sw.txt; grep -E "^FAILED|^E  +AssertionError" $res/tests-sw.txt | head -6
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

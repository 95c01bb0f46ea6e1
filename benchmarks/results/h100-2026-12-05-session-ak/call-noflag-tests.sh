#!/usr/bin/env bash
# The flagged residual form's removal (branch remove-flagged-residual, ABI 19; PERF_LOG #154/#155: a measured loss):
# its kernel tests and the sanitizer's three tools, before it is merged. Run from a checkout of the branch, carrying
# variants/base.so built there (`PYTHON=/path/to/python3.12 bash benchmarks/ab/build.sh variants HEAD base`) and
# .sanitizer/ (`python3 -m pip download --no-deps nvidia-cuda-sanitizer-api==13.5.25 -d .sanitizer`).
# Then kernel_profile at batch 1 and 8 for the record: the default path lost a per-task check and 6% of its SASS
# (41,496 -> 39,032 instructions), so its step should be main's within the noise (session AJ's H100: main 2486-2500 us
# at batch 1, 10097-10143 at 8, ab.interleaved medians). `bash call-noflag-tests.sh [SECONDS]` (default 560).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-560}
left() { echo $(( limit - ($(date +%s) - start) )); }
stamp() { echo "$1 rc=$2 ($(( $(date +%s) - start )) s)"; }
cp variants/base.so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt; cat $res/gpu.txt
python3 -c "from vllm_megakernel import _C; print(_C.build_info())"
# session AI: 130 s ran 77 of jw's ~91 kernel tests on the H100
timeout -k 5 240 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_extension_on_gpu.py \
  tests/gpu/test_each_opcode.py tests/gpu/test_megakernel_step.py > $res/kernel-tests.txt 2>&1
stamp kernel-tests $?; tail -1 $res/kernel-tests.txt; grep -E "^(FAILED|ERROR)" $res/kernel-tests.txt | head -8
if [ $(left) -gt 100 ]; then
  cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
  COMPUTE_SANITIZER=$cs timeout -k 5 $(( $(left) - 60 )) python3 -m pytest -v -rA -p no:cacheprovider --durations=6 \
    tests/gpu/test_sanitizer.py -k "4500-7-pad]" > $res/sanitizer.txt 2>&1
  stamp sanitizer $?; tail -1 $res/sanitizer.txt; grep -E "^(PASSED|FAILED|ERROR)" $res/sanitizer.txt
fi
if [ $(left) -gt 50 ]; then
  timeout -k 5 $(( $(left) - 8 )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
    --batch-sizes 1,8 --iters 10 --out $res/profile > $res/profile.log 2>&1
  stamp profile $?; grep -A4 "^| batch | context" $res/profile/report.md | head -5
fi
cd $OUT && tar czf r.tgz r && rm -rf r

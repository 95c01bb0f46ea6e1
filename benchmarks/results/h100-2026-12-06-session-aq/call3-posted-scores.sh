#!/usr/bin/env bash
# Session AQ, call 3. Carry vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so, built from this checkout's csrc/
# (ABI 20: the early post of call 1 and posted scores, off by default) and .sanitizer/.
# (1) `benchmarks.ab.interleaved` at batch 1 and 2, one process a batch with an A/A control: the default against
#     ps (posted_scores=1); at batch 2 also pr (posted_routing=1) and pspr (both);
# (2) kernel_profile at batch 1 with ps (the top-k's start against the routers' ends);
# (3) the kernel tests (test_megakernel_step.py, test_each_opcode.py: the posted-scores step cases and the aborts
#     with posted scores among them);
# (4) compute-sanitizer's three tools on the batch-1 posted-scores case, with the time left.
# `bash call3-posted-scores.sh [SECONDS]` (default 560; later stages are skipped on time). Results in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-560}
left() { echo $(( limit - ($(date +%s) - start) )); }
stamp() { echo "$1 rc=$2 ($(( $(date +%s) - start )) s)"; }
so=vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
cat $res/gpu.txt
md5sum $so > $res/md5.txt
python3 -c "from vllm_megakernel import _C; print(_C.build_info())" | tee $res/build-info.txt
timeout -k 5 100 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes 1 \
  --rounds 12 --iters 20 --control --variant base=$so --variant ps=$so@posted_scores=1 --out $res/b1 > $res/b1.log 2>&1
stamp b1 $?; cat $res/b1/table.md 2>/dev/null || tail -3 $res/b1.log
timeout -k 5 100 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes 2 \
  --rounds 8 --iters 20 --control --variant base=$so --variant ps=$so@posted_scores=1 \
  --variant pr=$so@posted_routing=1 --variant pspr=$so@posted_scores=1,posted_routing=1 --out $res/b2 > $res/b2.log 2>&1
stamp b2 $?; cat $res/b2/table.md 2>/dev/null || tail -3 $res/b2.log
timeout -k 5 60 python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
  --batch-sizes 1 --iters 10 --schedules "default;posted_scores=1" --out $res/profile > $res/profile.log 2>&1
stamp profile $?
grep -A4 "^| batch | context" $res/profile/report.md 2>/dev/null | head -5 || tail -3 $res/profile.log
timeout -k 5 200 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
  tests/gpu/test_each_opcode.py > $res/kernel-tests.txt 2>&1
stamp "kernel tests" $?; grep -E "^(FAILED|ERROR)" $res/kernel-tests.txt; tail -1 $res/kernel-tests.txt
if [ $(left) -gt 60 ]; then
  cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
  COMPUTE_SANITIZER=$cs timeout -k 5 $(( $(left) - 10 )) python3 -m pytest -v -rA -p no:cacheprovider --durations=6 \
    tests/gpu/test_sanitizer.py -k "4500-batch-1-posted-scores]" > $res/sanitizer.txt 2>&1
  stamp "sanitizer" $?; tail -1 $res/sanitizer.txt; grep -E "^(PASSED|FAILED|ERROR)" $res/sanitizer.txt
fi
cd $OUT && tar czf r.tgz r && rm -rf r

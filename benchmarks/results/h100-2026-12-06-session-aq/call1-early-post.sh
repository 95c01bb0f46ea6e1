#!/usr/bin/env bash
# Session AQ, call 1. Carry vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so (main), variants/ep.so (main +
# the top-k's early post at batch 1, topk::post_one_row; built from this checkout's csrc/ by
# `benchmarks/ab/build.sh variants HEAD base ep=early-post.patch`) and .sanitizer/.
# (1) `benchmarks.ab.interleaved` at batch 1, one process with an A/A control: main against ep and nopr;
# (2) kernel_profile of ep at batch 1 (the top-k's and the first expert task's times);
# (3) the kernel tests with ep.so as the extension;
# (4) compute-sanitizer's three tools on ep's batch-1 case (the early post) with the time left.
# `bash call1-early-post.sh [SECONDS]` (default 560; later stages are skipped on time). Results in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-560}
left() { echo $(( limit - ($(date +%s) - start) )); }
stamp() { echo "$1 rc=$2 ($(( $(date +%s) - start )) s)"; }
so=vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
cat $res/gpu.txt
md5sum $so variants/ep.so > $res/md5.txt
cp $so /tmp/main.so
timeout -k 5 110 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes 1 \
  --rounds 12 --iters 20 --control --variant base=$so --variant ep=variants/ep.so \
  --variant nopr=$so@posted_routing=0 --out $res/b1 > $res/b1.log 2>&1
stamp b1 $?; cat $res/b1/table.md 2>/dev/null || tail -3 $res/b1.log
cp variants/ep.so $so
python3 -c "from vllm_megakernel import _C; print(_C.build_info())" | tee $res/build-info.txt
timeout -k 5 60 python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
  --batch-sizes 1 --iters 10 --schedules default --out $res/profile > $res/profile.log 2>&1
stamp profile $?
grep -A3 "^| batch | context" $res/profile/report.md 2>/dev/null | head -4 || tail -3 $res/profile.log
timeout -k 5 170 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
  tests/gpu/test_each_opcode.py > $res/ep-kernel-tests.txt 2>&1
stamp "ep kernel tests" $?; grep -E "^(FAILED|ERROR)" $res/ep-kernel-tests.txt; tail -1 $res/ep-kernel-tests.txt
if [ $(left) -gt 60 ]; then
  cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
  COMPUTE_SANITIZER=$cs timeout -k 5 $(( $(left) - 10 )) python3 -m pytest -v -rA -p no:cacheprovider --durations=6 \
    tests/gpu/test_sanitizer.py -k "4500-batch-1]" > $res/ep-sanitizer.txt 2>&1
  stamp "ep sanitizer" $?; tail -1 $res/ep-sanitizer.txt; grep -E "^(PASSED|FAILED|ERROR)" $res/ep-sanitizer.txt
fi
cd $OUT && tar czf r.tgz r && rm -rf r

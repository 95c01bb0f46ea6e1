#!/usr/bin/env bash
# Session AP, call 2. Call 1's synccheck failed on main ("Missing wait" at the look-ahead lane's arrival on
# inputs_seen[slot]: phases that completed with no thread waiting on them). Carry
# vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so (main) and variants/sw.so (main + the look-ahead lane waiting on
# the phase its own arrival completed), and .sanitizer/.
# (0) compute-sanitizer's three tools on sw's 5-layer 4500-7-pad step;
# (1) the kernel tests with sw.so as the extension;
# (2) `benchmarks.ab.interleaved` at batch 1, one process with an A/A control: main against sw and nopr
#     (main with posted_routing=0);
# (3) kernel_profile of sw at batch 1, 8 (and 64 on an H200) with the time left: issue #10's table.
# `bash call2-kernel.sh [SECONDS]` (default 560; later stages are skipped on time). Results in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-560}
left() { echo $(( limit - ($(date +%s) - start) )); }
stamp() { echo "$1 rc=$2 ($(( $(date +%s) - start )) s)"; }
so=vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
cat $res/gpu.txt
md5sum $so variants/sw.so > $res/md5.txt
cp $so /tmp/main.so && cp variants/sw.so $so
python3 -c "from vllm_megakernel import _C; print(_C.build_info())" | tee $res/build-info.txt
cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
COMPUTE_SANITIZER=$cs timeout -k 5 180 python3 -m pytest -v -rA -p no:cacheprovider --durations=6 \
  tests/gpu/test_sanitizer.py -k "4500-7-pad]" > $res/sw-sanitizer.txt 2>&1
stamp "sw sanitizer" $?; tail -1 $res/sw-sanitizer.txt; grep -E "^(PASSED|FAILED|ERROR)" $res/sw-sanitizer.txt
timeout -k 5 150 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
  tests/gpu/test_each_opcode.py > $res/sw-kernel-tests.txt 2>&1
stamp "sw kernel tests" $?; grep -E "^(FAILED|ERROR)" $res/sw-kernel-tests.txt; tail -1 $res/sw-kernel-tests.txt
cp /tmp/main.so $so  # the A/B loads main as its base from the extension's path
if [ $(left) -gt 115 ]; then
  timeout -k 5 105 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes 1 \
    --rounds 10 --iters 20 --control --variant base=$so --variant sw=variants/sw.so \
    --variant nopr=$so@posted_routing=0 --out $res/b1 > $res/b1.log 2>&1
  stamp b1 $?; cat $res/b1/table.md 2>/dev/null || tail -3 $res/b1.log
fi
cp variants/sw.so $so
if [ $(left) -gt 45 ]; then
  timeout -k 5 $(( $(left) - 8 )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
    --batch-sizes 1,8,64 --iters 10 --schedules default --out $res/profile > $res/profile.log 2>&1
  stamp profile $?
  if [ -f $res/profile/report.md ]; then
    grep -A5 "^| batch | context" $res/profile/report.md | head -6; grep "^spans of every wave" $res/profile/report.md
  else
    tail -3 $res/profile.log
  fi
fi
cd $OUT && tar czf r.tgz r && rm -rf r

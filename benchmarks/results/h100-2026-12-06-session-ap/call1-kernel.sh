#!/usr/bin/env bash
# Session AP, call 1 (an H100: the H200 had no machine to start). The kernel alone at 8K, no vLLM. Carry
# vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so (main at 2dbf05f's csrc/, with the input look-ahead lane),
# .sanitizer/ and variants/jw.so (main + benchmarks/candidates/joint-input-waits.patch).
# (0) compute-sanitizer's three tools on main's 5-layer 4500-7-pad step (the look-ahead's mbarrier protocol has not
#     been under the sanitizer yet);
# (1) `benchmarks.ab.interleaved` at batch 1, one process with an A/A control: main against jw;
# (2) the kernel tests with jw.so as the extension (jw's earlier run ran out of time before they finished);
# (3) kernel_profile of main at batch 1 with the time left (issue #10's table on an H100).
# `bash call1-kernel.sh [SECONDS]` (default 560; later stages are skipped on time). Results in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-560}
left() { echo $(( limit - ($(date +%s) - start) )); }
stamp() { echo "$1 rc=$2 ($(( $(date +%s) - start )) s)"; }
so=vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
cat $res/gpu.txt
python3 -c "from vllm_megakernel import _C; print(_C.build_info())" | tee $res/build-info.txt
md5sum $so variants/jw.so > $res/md5.txt
cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
COMPUTE_SANITIZER=$cs timeout -k 5 210 python3 -m pytest -v -rA -p no:cacheprovider --durations=6 \
  tests/gpu/test_sanitizer.py -k "4500-7-pad]" > $res/sanitizer.txt 2>&1
stamp sanitizer $?; tail -1 $res/sanitizer.txt; grep -E "^(PASSED|FAILED|ERROR)" $res/sanitizer.txt
timeout -k 5 100 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes 1 \
  --rounds 10 --iters 20 --control --variant base=$so --variant jw=variants/jw.so --out $res/b1 > $res/b1.log 2>&1
stamp b1 $?; cat $res/b1/table.md 2>/dev/null || tail -3 $res/b1.log
cp $so /tmp/main.so && cp variants/jw.so $so
t=$(( $(left) - 60 )); [ $t -gt 150 ] && t=150
if [ $t -gt 30 ]; then
  timeout -k 5 $t python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
    tests/gpu/test_each_opcode.py > $res/jw-kernel-tests.txt 2>&1
  stamp "jw kernel tests" $?; grep -E "^(FAILED|ERROR)" $res/jw-kernel-tests.txt; tail -1 $res/jw-kernel-tests.txt
fi
cp /tmp/main.so $so
if [ $(left) -gt 45 ]; then
  timeout -k 5 $(( $(left) - 8 )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
    --batch-sizes 1 --iters 10 --schedules default --out $res/profile > $res/profile.log 2>&1
  stamp profile $?
  if [ -f $res/profile/report.md ]; then
    grep -A3 "^| batch | context" $res/profile/report.md | head -4; grep "^spans of every wave" $res/profile/report.md
  else
    tail -3 $res/profile.log
  fi
fi
cd $OUT && tar czf r.tgz r && rm -rf r

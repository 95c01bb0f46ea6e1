#!/usr/bin/env bash
# Session AO, call 1: the kernel alone at 8K (no vLLM, no stash calls). Carry
# vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so (main), .sanitizer/ and variants/la.so (main + the candidate
# benchmarks/candidates/input-lookahead.patch: a look-ahead lane checks each task's input barriers before the
# consumer leader gets there).
# (1) `benchmarks.ab.interleaved`, one process a batch with an A/A control: batch 1 main (posted routing on) against
#     nopr (posted_routing=0), op (o_prefetch=1), u48 (moe_up_cols=48), la, lau48.
# (2) the kernel tests with la.so as the extension (test_megakernel_step.py, test_each_opcode.py), then batch 2
#     (la, op) and batch 8 (la) as (1): the correctness gate before the smaller batches' A/B on a short call.
# (3) with the time left, compute-sanitizer (the 13.5.25 wheel, carry .sanitizer/) on la's 5-layer step, then
#     kernel_profile of main at batch 1 and 8 (issue #10's table).
# `bash call1-kernel.sh [SECONDS]` (default 480; later stages are skipped on time). Results in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-480}
left() { echo $(( limit - ($(date +%s) - start) )); }
stamp() { echo "$1 rc=$2 ($(( $(date +%s) - start )) s)"; }
so=vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
cat $res/gpu.txt
python3 -c "from vllm_megakernel import _C; print(_C.build_info())" | tee $res/build-info.txt
md5sum $so variants/la.so > $res/md5.txt
run() {  # NAME BATCH ROUNDS SECONDS NAME=PATH[@SCHEDULE]...: one process, main against each, with an A/A control
  local name=$1 b=$2 rounds=$3 lim=$4; shift 4
  [ $(left) -lt $(( lim + 5 )) ] && { echo "$name: skipped, $(left) s left"; return; }
  local args=(--variant base=$so)
  for v in "$@"; do args+=(--variant "$v"); done
  timeout -k 5 $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds $rounds --iters 20 --control "${args[@]}" --out $res/$name > $res/$name.log 2>&1
  stamp $name $?; cat $res/$name/table.md 2>/dev/null || tail -3 $res/$name.log
}
run b1 1 10 100 nopr=$so@posted_routing=0 op=$so@o_prefetch=1 u48=$so@moe_up_cols=48 la=variants/la.so \
  lau48=variants/la.so@moe_up_cols=48
cp $so /tmp/main.so && cp variants/la.so $so
python3 -c "from vllm_megakernel import _C; print('tests on', _C.build_info())"
t=$(( $(left) - 5 )); [ $t -gt 220 ] && t=220; [ $t -lt 30 ] && t=30
timeout -k 5 $t python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
  tests/gpu/test_each_opcode.py > $res/la-kernel-tests.txt 2>&1
stamp "la kernel tests" $?; grep -E "^(FAILED|ERROR)" $res/la-kernel-tests.txt; tail -1 $res/la-kernel-tests.txt
cp /tmp/main.so $so  # the A/B below loads main as its base from the extension's path
run b2 2 8 55 la=variants/la.so op=$so@o_prefetch=1
run b8 8 6 60 la=variants/la.so
cp variants/la.so $so
if [ $(left) -gt 170 ]; then  # memcheck, racecheck, synccheck on la's 5-layer step (the new mbarrier protocol)
  cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
  COMPUTE_SANITIZER=$cs timeout -k 5 $(( $(left) - 50 )) python3 -m pytest -v -rA -p no:cacheprovider --durations=6 \
    tests/gpu/test_sanitizer.py -k "4500-7-pad]" > $res/la-sanitizer.txt 2>&1
  stamp "la sanitizer" $?; tail -1 $res/la-sanitizer.txt; grep -E "^(PASSED|FAILED|ERROR)" $res/la-sanitizer.txt
fi
cp /tmp/main.so $so
if [ $(left) -gt 50 ]; then
  timeout -k 5 $(( $(left) - 8 )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
    --batch-sizes 1,8 --iters 10 --schedules default --out $res/profile > $res/profile.log 2>&1
  stamp profile $?
  if [ -f $res/profile/report.md ]; then
    grep -A5 "^| batch | context" $res/profile/report.md | head -6; grep "^spans of every wave" $res/profile/report.md
  else
    tail -3 $res/profile.log
  fi
fi
cd $OUT && tar czf r.tgz r && rm -rf r

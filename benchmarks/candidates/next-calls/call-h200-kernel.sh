#!/usr/bin/env bash
# Next H200 session, the kernel alone (no vLLM, no stash calls; carry vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
# built from main; .sanitizer/ with the nvidia-cuda-sanitizer-api 13.5.25 wheel is optional). Session AQ shortened
# batch 1's routing chain on an H100: the top-k's early post (9a53a94, PERF_LOG #189) and posted scores (3a3a8fd,
# ABI 20, #190; on at batch 1), both under main's default posted routing; none of it has run on an H200, where session
# AO measured posted routing off at batch 1 -0.77% against the control (#184, before both changes).
# The control runs up to ~0.6% from main in this harness (#186, #188): compare with main and with the control.
# (0) compute-sanitizer's three tools on the batch-1 posted-scores case (skipped with a message if .sanitizer/ was not
#     carried: session AQ ran them on the H100, 3 passed);
# (1) `benchmarks.ab.interleaved --copies 3` (every extension loaded three times, a variant's round the median over
#     its copies: session AQ added it against the ~0.6% a module's code placement moves a step) at batch 1, 12
#     rounds, one process with an A/A control: main (posted routing and
#     posted scores on) against nops (posted_scores=0), nopr (posted_routing=0, posted scores still on) and u48
#     (moe_up_cols=48); batch 2: ps (posted_scores=1) and pspr (both on), undecided on the H100 (#190);
# (2) kernel_profile at batch 1, 8 and 64, default schedule (issue #10's table). Batch 64 at 8K needs the H200's
#     memory: on an H100 kernel_profile leaves it out and says why.
# Predictions (#191): nops +1 to +2.5% at batch 1 (the routing chain passed ~half of a delay to the H200's step, #116);
# nopr within +-1%; ps at batch 2 -0.5 to +0.5%.
# `bash call-h200-kernel.sh [SECONDS]` (default 560; later stages are skipped on time). Results in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-560}
left() { echo $(( limit - ($(date +%s) - start) )); }
stamp() { echo "$1 rc=$2 ($(( $(date +%s) - start )) s)"; }
so=vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
python3 -c "from vllm_megakernel import _C; print(_C.build_info())" | tee $res/build-info.txt
run() {  # NAME BATCH SECONDS NAME=SCHEDULE...: one process, main against each schedule, with an A/A control
  local name=$1 b=$2 lim=$3; shift 3
  [ $(left) -lt $(( lim + 5 )) ] && { echo "$name: skipped, $(left) s left"; return; }
  local args=(--variant base=$so)
  for v in "$@"; do args+=(--variant "${v%%=*}=$so@${v#*=}"); done
  timeout -k 5 $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds $([ $b = 1 ] && echo 12 || echo 8) --iters 20 --copies 3 --control "${args[@]}" --out $res/$name > $res/$name.log 2>&1
  stamp $name $?; cat $res/$name/table.md 2>/dev/null || tail -3 $res/$name.log
}
if ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl > /dev/null 2>&1; then
  cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
  COMPUTE_SANITIZER=$cs timeout -k 5 240 python3 -m pytest -v -rA -p no:cacheprovider --durations=6 \
    tests/gpu/test_sanitizer.py -k "4500-batch-1-posted-scores]" > $res/sanitizer.txt 2>&1
  stamp sanitizer $?; tail -1 $res/sanitizer.txt; grep -E "^(PASSED|FAILED|ERROR)" $res/sanitizer.txt
else
  echo "sanitizer: skipped, .sanitizer/ was not carried"
fi
run b1 1 170 nops=posted_scores=0 nopr=posted_routing=0 u48=moe_up_cols=48
run b2 2 110 ps=posted_scores=1 pspr=posted_scores=1,posted_routing=1
if [ $(left) -gt 60 ]; then
  schedules="default"
  # kernel_profile rewrites report.md after each row, so a timeout keeps the rows it finished
  timeout -k 5 $(( $(left) - 8 )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
    --batch-sizes 1,8,64 --iters 10 --schedules "$schedules" --out $res/profile > $res/profile.log 2>&1
  stamp profile $?
  if [ -f $res/profile/report.md ]; then
    grep -A8 "^| batch | context" $res/profile/report.md | head -9; grep "^spans of every wave" $res/profile/report.md
  else
    tail -3 $res/profile.log
  fi
else
  echo "profile: skipped, $(left) s left"
fi
cd $OUT && tar czf r.tgz r && rm -rf r

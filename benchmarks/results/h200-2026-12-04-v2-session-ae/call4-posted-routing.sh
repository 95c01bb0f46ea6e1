#!/usr/bin/env bash
# As it ran in session AE's call 4 (`bash call4-posted-routing.sh 400`, on main at 5eb7f8b; 347 s); it was
# benchmarks/candidates/next-calls/call-posted-routing.sh.
# Kernel alone (no vLLM, no stash calls; carry vllm_megakernel/_C*.so built from main, which has posted routing
# as a schedule choice, and .sanitizer/), PERF_LOG #149, in order of need, each stage only while the call's time
# allows it: (1) `benchmarks.ab.interleaved` at batch 1, one process with an A/A control: main against pr
# (posted_routing=1: the top-k posts its work list as self-flagged words that the expert tasks' producers poll), c3
# (stages_in_flight=3, -1.14% in session AE's call 1, rerun in another process before a default moves) and prc3
# (both); (2) the posted-routing kernel test (its words against the route log, bit-equal to the top-k's step);
# (3) the A/B at batch 8 (pr); (4) compute-sanitizer memcheck / racecheck / synccheck on the posted-routing case;
# (5) the A/B at batch 2 and 4; (6) kernel_profile at batch 1 and 8 of the default and posted_routing=1 in one run
# (the router_topk -> mlp_up hop); (7) the other kernel tests. `bash call-posted-routing.sh [SECONDS]` (default
# 540; all of it ~450 s).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-540}
left() { echo $(( limit - ($(date +%s) - start) )); }
stamp() { echo "$1 rc=$2 ($(( $(date +%s) - start )) s)"; }
so=$(ls vllm_megakernel/_C*.so)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
run() {  # NAME BATCH SECONDS VARIANT=SCHEDULE...: one process, main against each schedule, with an A/A control
  local name=$1 b=$2 lim=$3; shift 3
  [ $(left) -lt $(( lim + 5 )) ] && { echo "$name: skipped, $(left) s left"; return; }
  local args=(--variant base=$so)
  for v in "$@"; do args+=(--variant "${v%%=*}=$so@${v#*=}"); done
  timeout -k 5 $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds 6 --iters 20 --control "${args[@]}" --out $res/$name > $res/$name.log 2>&1
  stamp $name $?; cat $res/$name/table.md 2>/dev/null || tail -3 $res/$name.log
}
tests() {  # NAME SECONDS PYTEST-ARGS...
  local name=$1 lim=$2; shift 2
  [ $(left) -lt $(( lim + 5 )) ] && { echo "$name: skipped, $(left) s left"; return; }
  timeout -k 5 $lim python3 -m pytest -q -rA -p no:cacheprovider --durations=5 "$@" > $res/$name.txt 2>&1
  stamp $name $?; tail -1 $res/$name.txt; grep -E "^(FAILED|ERROR)" $res/$name.txt | head -8
}
run b1 1 70 pr=posted_routing=1 c3=stages_in_flight=3 prc3=posted_routing=1,stages_in_flight=3
tests posted-test 60 tests/gpu/test_megakernel_step.py -k posted
run b8 8 70 pr=posted_routing=1
if [ $(left) -gt 80 ]; then
  cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
  COMPUTE_SANITIZER=$cs tests sanitizer 75 tests/gpu/test_sanitizer.py -k posted-routing
fi
run b2 2 50 pr=posted_routing=1
run b4 4 55 pr=posted_routing=1
if [ $(left) -gt 85 ]; then
  timeout -k 5 80 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,8 --iters 10 \
    --schedules "default;posted_routing=1" --out $res/profile > $res/profile.log 2>&1
  stamp profile $?; grep -A5 "^| batch | context" $res/profile/report.md | head -6
  grep -E "^\| router_topk \| mlp_up \|" $res/profile/report.md
fi
tests kernel-tests $(( $(left) - 10 )) tests/gpu/test_each_opcode.py tests/gpu/test_megakernel_step.py -k "not posted"
cd $OUT && tar czf r.tgz r && rm -rf r

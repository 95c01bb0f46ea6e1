#!/usr/bin/env bash
# Kernel alone (no vLLM, no stash calls; carry vllm_megakernel/_C*.so built from main, which has posted routing
# as a schedule choice, and .sanitizer/), PERF_LOG #149: (1) `benchmarks.ab.interleaved`, one process per batch
# with an A/A control: main against pr (posted_routing=1: the top-k posts its work list as self-flagged words
# that the expert tasks' producers poll), at batch 1 also c3 (stages_in_flight=3, -1.14% in session AE's call 1,
# rerun in another process before a default moves) and prc3 (both); (2) kernel_profile at batch 1 and 8 of the
# default and posted_routing=1 in one run (what should move: the router_topk -> mlp_up hop, the experts' first
# start); (3) the kernel tests (the posted-routing case among them) and compute-sanitizer memcheck / racecheck /
# synccheck on the posted-routing case. `bash call-posted-routing.sh [SECONDS]` (default 540; ~450 s expected).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-540}
left() { echo $(( limit - ($(date +%s) - start) )); }
so=$(ls vllm_megakernel/_C*.so)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
run() {  # NAME BATCH SECONDS VARIANT=SCHEDULE...: one process, main against each schedule, with an A/A control
  local name=$1 b=$2 lim=$3; shift 3
  local args=(--variant base=$so)
  for v in "$@"; do args+=(--variant "${v%%=*}=$so@${v#*=}"); done
  timeout -k 5 $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds 6 --iters 20 --control "${args[@]}" --out $res/$name > $res/$name.log 2>&1
  echo "$name rc=$? ($(( $(date +%s) - start )) s)"; cat $res/$name/table.md 2>/dev/null || tail -3 $res/$name.log
}
run b1 1 70 pr=posted_routing=1 c3=stages_in_flight=3 prc3=posted_routing=1,stages_in_flight=3
run b2 2 50 pr=posted_routing=1
run b4 4 55 pr=posted_routing=1
run b8 8 70 pr=posted_routing=1
timeout -k 5 80 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,8 --iters 10 \
  --schedules "default;posted_routing=1" --out $res/profile > $res/profile.log 2>&1
echo "profile rc=$? ($(( $(date +%s) - start )) s)"; grep -A5 "^| batch | context" $res/profile/report.md | head -6
grep -E "^\| router_topk \| mlp_up \|" $res/profile/report.md
timeout -k 5 $(( $(left) - 75 )) python3 -m pytest -q -rA -p no:cacheprovider --durations=5 tests/gpu/test_each_opcode.py \
  tests/gpu/test_megakernel_step.py > $res/kernel-tests.txt 2>&1
echo "kernel tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/kernel-tests.txt
grep -E "^FAILED|posted" $res/kernel-tests.txt | head -12
cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
COMPUTE_SANITIZER=$cs timeout -k 5 $(( $(left) - 5 )) python3 -m pytest -v -rA -p no:cacheprovider --durations=4 \
  tests/gpu/test_sanitizer.py -k "posted-routing" > $res/sanitizer.txt 2>&1
echo "sanitizer rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer.txt
grep -E "^(PASSED|FAILED|ERROR)" $res/sanitizer.txt
cd $OUT && tar czf r.tgz r && rm -rf r

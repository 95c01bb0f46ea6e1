#!/usr/bin/env bash
# Session V, device call 1 (kernel alone, no vLLM; carry vllm_megakernel/_C*.so built from this commit's csrc/
# and .sanitizer/ with the nvidia-cuda-sanitizer-api 13.5.25 wheel): local routing (StepShape.local_routing, ABI
# 14; PERF_LOG #111). (1) the kernel tests, with the new local-routing cases (whole step against the reference and
# bit-equal to the top-k's work list at batch 1 / 3 / 8; uniform routing drawn by the producers); (2)
# compute-sanitizer memcheck / racecheck / synccheck on the local-routing step; (3) `benchmarks.ab.interleaved`,
# base (the default schedule) against lr (local_routing=1), one process per batch at 8K.
# `bash call1-local-routing.sh [SECONDS]` (default 560).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-560}
left() { echo $(( limit - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
timeout 200 python3 -m pytest -q -rA -p no:cacheprovider --durations=8 tests/gpu/test_each_opcode.py \
  tests/gpu/test_megakernel_step.py > $res/kernel-tests.txt 2>&1
echo "kernel tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/kernel-tests.txt
grep -E "^FAILED|local routing|local_routing" $res/kernel-tests.txt | head -12
w=$(ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl); d=/tmp/cs-13.5.25; rm -rf $d; python3 -m zipfile -e $w $d
chmod -R u+x $d/nvidia/cu13; cs=$d/nvidia/cu13/bin/compute-sanitizer
COMPUTE_SANITIZER=$cs timeout 160 python3 -m pytest -v -rA -p no:cacheprovider --durations=3 \
  tests/gpu/test_sanitizer.py -k local_routing > $res/sanitizer.txt 2>&1
echo "sanitizer rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer.txt; grep -E "^(PASSED|FAILED|ERROR)" $res/sanitizer.txt
so=$(ls vllm_megakernel/_C*.so)
run() {  # NAME BATCH LIMIT VARIANT=SCHEDULE...
  local name=$1 b=$2 lim=$3; shift 3
  local t=$(( $(left) - 15 )); [ $t -lt 30 ] && { echo "$name: no time left"; return; }; [ $lim -lt $t ] && t=$lim
  local args=(--variant base=$so)
  for v in "$@"; do args+=(--variant "${v%%=*}=$so@${v#*=}"); done
  timeout $t python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds 8 --iters 30 "${args[@]}" --out $res/$name > $res/$name.log 2>&1
  echo "$name rc=$? ($(( $(date +%s) - start )) s)"; cat $res/$name/table.md 2>/dev/null || tail -5 $res/$name.log
}
run b1 1 70 lr=local_routing=1
run b2 2 60 lr=local_routing=1
run b4 4 60 lr=local_routing=1
run b8 8 60 lr=local_routing=1
cd $OUT && tar czf r.tgz r && rm -rf r

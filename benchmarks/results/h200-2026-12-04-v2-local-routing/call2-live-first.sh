#!/usr/bin/env bash
# Session V, device call 2 (kernel alone, no vLLM; carry vllm_megakernel/_C*.so of this commit's csrc/ and
# .sanitizer/): (1) compute-sanitizer memcheck / racecheck / synccheck on the local-routing step (call 1's -k
# matched nothing); (2) `benchmarks.ab.interleaved` at 8K, one process per batch: split_order=live_first (lf),
# with 48 live attention tasks (lf48), each with local routing (lflr, lf48lr), against the default (PERF_LOG
# #112). `bash call2-live-first.sh [SECONDS]` (default 400).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-400}
left() { echo $(( limit - ($(date +%s) - start) )); }
w=$(ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl); d=/tmp/cs-13.5.25; rm -rf $d; python3 -m zipfile -e $w $d
chmod -R u+x $d/nvidia/cu13; cs=$d/nvidia/cu13/bin/compute-sanitizer
COMPUTE_SANITIZER=$cs timeout 170 python3 -m pytest -v -rA -p no:cacheprovider --durations=3 \
  tests/gpu/test_sanitizer.py -k "local" > $res/sanitizer.txt 2>&1
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
lf=split_order=live_first
run b1 1 90 lf=$lf lf48=$lf,attn_live_tasks=48 lflr=$lf,local_routing=1 lf48lr=$lf,attn_live_tasks=48,local_routing=1
run b2 2 60 lf=$lf lflr=$lf,local_routing=1
run b4 4 50 lf=$lf
cd $OUT && tar czf r.tgz r && rm -rf r

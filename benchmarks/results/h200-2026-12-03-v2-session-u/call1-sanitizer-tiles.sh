#!/usr/bin/env bash
# Session U, device call 1 (kernel alone, no vLLM; carry vllm_megakernel/_C*.so built from this commit's csrc/ and
# .sanitizer/ with the nvidia-cuda-sanitizer-api 13.5.25 wheel): (1) tests/gpu/test_sanitizer.py, every case
# (4500-7-pad and issue #11's ragged lengths to 128K, memcheck / synccheck / racecheck) on the kernel with the L2
# evict-first copies and the live split cap, their first run on either; (2) the schedule candidates of
# benchmarks/candidates/next-calls/call-tiles-on-cap.sh (PERF_LOG #108-#109), one `benchmarks.ab.interleaved`
# process per batch at 8K. `bash call1-sanitizer-tiles.sh [SECONDS]` (default 560).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-560}
left() { echo $(( limit - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
w=$(ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl); d=/tmp/cs-13.5.25; rm -rf $d; python3 -m zipfile -e $w $d
chmod -R u+x $d/nvidia/cu13; cs=$d/nvidia/cu13/bin/compute-sanitizer
COMPUTE_SANITIZER=$cs MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 330 python3 -m pytest -v -rA -p no:cacheprovider \
  --durations=6 tests/gpu/test_sanitizer.py > $res/sanitizer.txt 2>&1
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
ce=combine_place=empty_splits
run b1 1 80 up24=moe_up_cols=24 up16=moe_up_cols=16 d64=moe_down_rows=64 cap48=attn_live_tasks=48 ce=$ce
run b2 2 70 cap32=attn_live_tasks=32 cap32t32=attn_live_tasks=32,attn_max_tiles=32 ce=$ce s32=attn_splits=32
run b4 4 70 cap32=attn_live_tasks=32 ce=$ce s16=attn_splits=16
cd $OUT && tar czf r.tgz r && rm -rf r

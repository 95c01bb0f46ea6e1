#!/usr/bin/env bash
# Call 4 (kernel alone, no vLLM; carry vllm_megakernel/_C*.so built from this commit's csrc/, ABI 13): the live
# attention split cap (StepShape.attn_live_tasks, layout.attn_split_tiles' live_splits / max_tiles) and the
# descending split order against the default (no cap, ascending), and the fixed split counts calls 2-3 measured,
# at 8K (batch 1, 2, 4, 8), 32K and 128K (batch 1). One `benchmarks.ab.interleaved` process per (batch, context).
# `bash call4-live-cap.sh`
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s)
so=$(ls vllm_megakernel/_C*.so)
run() {  # NAME BATCH CONTEXT LIMIT VARIANT=SCHEDULE...
  local name=$1 b=$2 ctx=$3 lim=$4; shift 4
  local args=(--variant base=$so)
  for v in "$@"; do args+=(--variant "${v%%=*}=$so@${v#*=}"); done
  timeout $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b --context $ctx \
    --rounds 8 --iters 30 "${args[@]}" --out $res/$name > $res/$name.log 2>&1
  echo "$name rc=$? ($(( $(date +%s) - start )) s)"; cat $res/$name/table.md 2>/dev/null || tail -5 $res/$name.log
}
cap=attn_live_tasks=64; capd=attn_live_tasks=64,split_order=descending
run b1-8k 1 8192 90 cap64=$cap cap64d=$capd desc=split_order=descending s64=attn_splits=64
run b1-32k 1 32768 90 cap64=$cap cap64d=$capd
run b1-128k 1 131072 90 cap64=$cap cap64d=$capd
run b2-8k 2 8192 90 cap64=$cap cap64d=$capd s32=attn_splits=32
run b4-8k 4 8192 100 cap64=$cap cap64d=$capd cap64t32=$capd,attn_max_tiles=32 s16=attn_splits=16
run b8-8k 8 8192 120 cap64d=$capd cap64t32=$capd,attn_max_tiles=32 s8=attn_splits=8
cd $OUT && tar czf r.tgz r && rm -rf r

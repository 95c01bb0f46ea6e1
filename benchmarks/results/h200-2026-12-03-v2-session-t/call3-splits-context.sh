#!/usr/bin/env bash
# Call 3 (kernel alone, no vLLM; carry vllm_megakernel/_C*.so built from main's csrc/): call 2's winners (batch 1
# at 64 splits, batch 2 at 32: 64 attention tasks a layer) at longer histories, where attention moves 4-16x the
# bytes and fewer splits mean fewer SMs streaming K/V; and batch 4 at 16 splits, batch 1 at 48 / 96. One
# `benchmarks.ab.interleaved` process per (batch, context). `bash call3-splits-context.sh`
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
run b1-8k 1 8192 90 s64=attn_splits=64 s48=attn_splits=48 s96=attn_splits=96
run b4-8k 4 8192 90 s16=attn_splits=16 s24=attn_splits=24
run b1-32k 1 32768 100 s64=attn_splits=64
run b2-32k 2 32768 100 s32=attn_splits=32
run b1-128k 1 131072 140 s64=attn_splits=64
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Call 2 (kernel alone, no vLLM; carry vllm_megakernel/_C*.so built from main's csrc/): how many SMs batch 1-8's
# attention should occupy at 8K. Call 1's s64 (64 splits at batch 1) measured -2.8%: the 51 SMs without an
# attention task went on to their up/gate tiles. attn_min_tiles (the smallest split, in 16-token tiles; a step
# field, so long contexts still use every split) does the same by work: at 8K with mt8 a full layer (512 tiles)
# runs 64 live splits and a sliding one (256 tiles) 32; mt16 32 / 16. One `benchmarks.ab.interleaved` process per
# batch. `bash call2-splits.sh`
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s)
so=$(ls vllm_megakernel/_C*.so)
declare -A vars=(
  [1]="s64=attn_splits=64 mt4=attn_min_tiles=4 mt8=attn_min_tiles=8 mt16=attn_min_tiles=16 s32=attn_splits=32"
  [2]="mt8=attn_min_tiles=8 mt16=attn_min_tiles=16 s32=attn_splits=32"
  [4]="mt16=attn_min_tiles=16 mt32=attn_min_tiles=32"
  [8]="mt32=attn_min_tiles=32 s8=attn_splits=8")
for b in 1 2 4 8; do
  args=(--variant base=$so)
  for v in ${vars[$b]}; do args+=(--variant "${v%%=*}=$so@${v#*=}"); done
  timeout 170 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b --rounds 8 \
    --iters 30 "${args[@]}" --out $res/ab-b$b > $res/ab-b$b.log 2>&1
  echo "ab batch $b rc=$? ($(( $(date +%s) - start )) s)"; cat $res/ab-b$b/table.md 2>/dev/null || tail -5 $res/ab-b$b.log
done
cd $OUT && tar czf r.tgz r && rm -rf r

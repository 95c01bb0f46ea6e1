#!/usr/bin/env bash
# A later call (kernel alone, no vLLM; carry vllm_megakernel/_C*.so built from main's csrc/): expert tile sizes and
# the live split cap's size re-timed on the kernel with the L2 hint and the cap (PERF_LOG #108), at 8K, one
# `benchmarks.ab.interleaved` process per batch. At batch 1 the up/gate wave's 192 tiles of 256 KB give 60 of 132
# SMs a second tile (the wave's tail: up/gate's last end ~33 us of a 44 us layer); 24 / 16 columns make 256 / 384
# tiles of 192 / 128 KB (PERF_LOG #50 measured 24 at +0.1% when a task cost ~3 us outside streaming, before the L2
# hint shortened the inputs phases). ce (combine_place=empty_splits, PERF_LOG #109) at batch 1-8, with the fixed
# splits it is meant to catch up with at batch 2 and 4. `bash call-tiles-on-cap.sh`
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s)
so=$(ls vllm_megakernel/_C*.so)
run() {  # NAME BATCH LIMIT VARIANT=SCHEDULE...
  local name=$1 b=$2 lim=$3; shift 3
  local args=(--variant base=$so)
  for v in "$@"; do args+=(--variant "${v%%=*}=$so@${v#*=}"); done
  timeout $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds 8 --iters 30 "${args[@]}" --out $res/$name > $res/$name.log 2>&1
  echo "$name rc=$? ($(( $(date +%s) - start )) s)"; cat $res/$name/table.md 2>/dev/null || tail -5 $res/$name.log
}
# Session U ran the rest of this call (benchmarks/results/h200-2026-12-03-v2-session-u, call 1); left: these three.
run b1 1 60 cap96=attn_live_tasks=96
run b4 4 60 t32=attn_max_tiles=32
run b8 8 120 ce=combine_place=empty_splits
cd $OUT && tar czf r.tgz r && rm -rf r

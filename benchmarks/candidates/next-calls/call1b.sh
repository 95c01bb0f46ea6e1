#!/usr/bin/env bash
# Session L, device call 1b (same machine as call 1; the same carry): the A/B base / both / abort twice at
# batch 8, 32, 64 (PERF_LOG #64-#66; both's two changes act on different waves, its traces attribute them);
# then batch 1's step over six placements of its own buffers (PERF_LOG #67).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
timeout 500 bash benchmarks/ab/run.sh variants $res/ab 8,32,64 base both abort base both abort > $res/ab.log 2>&1
echo "ab rc=$? ($(( $(date +%s) - start )) s)"; tail -9 $res/ab.log
# PERF_LOG #67: batch 1's spread, placement of the step's own buffers or not (main's kernel)
timeout $(( 580 - ($(date +%s) - start) )) python3 -m benchmarks.step_placements --model configs/north-mini-code \
  --batch-size 1 --steps 6 --rounds 5 --iters 20 --out $res/placements-b1 > $res/placements-b1.log 2>&1
echo "placements rc=$? ($(( $(date +%s) - start )) s)"; tail -3 $res/placements-b1.log
cd $OUT && tar czf r.tgz r && rm -rf r

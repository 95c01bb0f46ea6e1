#!/usr/bin/env bash
# Session L, device call 1b (same machine as call 1; the same carry): the A/B base / cands / abort twice at
# batch 8, 32, 64 (PERF_LOG #64-#66, #68; cands's three changes act on different waves or phases (the top-k
# task, the QKV / router stages, the QKV tail), its traces attribute them);
# then batch 1's step over six placements of its own buffers (PERF_LOG #67); batch 8's 16 attention splits
# (PERF_LOG #59) if time is left.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
timeout 500 bash benchmarks/ab/run.sh variants $res/ab 8,32,64 base cands abort base cands abort > $res/ab.log 2>&1
echo "ab rc=$? ($(( $(date +%s) - start )) s)"; tail -9 $res/ab.log
# PERF_LOG #67: batch 1's spread, placement of the step's own buffers or not (main's kernel)
timeout $(( 580 - ($(date +%s) - start) )) python3 -m benchmarks.step_placements --model configs/north-mini-code \
  --batch-size 1 --steps 6 --rounds 5 --iters 20 --out $res/placements-b1 > $res/placements-b1.log 2>&1
echo "placements rc=$? ($(( $(date +%s) - start )) s)"; tail -3 $res/placements-b1.log
# PERF_LOG #59: batch 8 with 16 attention splits (128 partial tasks) against the default 17 (136), twice
timeout $(( 590 - ($(date +%s) - start) )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
  --batch-sizes 8 --iters 20 --schedules "default;attn_splits=16;default;attn_splits=16" --out $res/splits8 \
  > $res/splits8.log 2>&1; echo "splits8 rc=$? ($(( $(date +%s) - start )) s)"; grep -h "us per step" $res/splits8.log
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session L, device call 1b (same machine as call 1; the same carry): the A/B base / cands / abort / base at
# batch 1, 32, 64 in one process environment (PERF_LOG #64-#66, #68). Shortened from the planned call (two
# rounds at 8, 32, 64, then #67's placements and #59's splits) to leave device time for the in-vLLM sweep.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
timeout 560 bash benchmarks/ab/run.sh variants $res/ab 1,32,64 base cands abort base > $res/ab.log 2>&1
echo "ab rc=$? ($(( $(date +%s) - start )) s)"; tail -9 $res/ab.log
cd $OUT && tar czf r.tgz r && rm -rf r

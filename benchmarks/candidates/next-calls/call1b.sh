#!/usr/bin/env bash
# Session L, device call 1b (same machine as call 1; the same carry): the A/B base / both / abort twice at
# batch 8, 32, 64 (PERF_LOG #64-#66; both's two changes act on different waves, its traces attribute them).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
timeout 580 bash benchmarks/ab/run.sh variants $res/ab 8,32,64 base both abort base both abort > $res/ab.log 2>&1
echo "ab rc=$?"; tail -9 $res/ab.log
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session M, device call 1b (same machine as call 1; the same carry): the A/B base / pk / prg / prgt / base at
# batch 8, 32, 64 (PERF_LOG #70, #71; batch 8 never takes the grouped form: pk and prg must leave it alone).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
timeout 570 bash benchmarks/ab/run.sh variants $res/ab 8,32,64 base pk prg prgt base > $res/ab.log 2>&1
echo "ab rc=$? ($(( $(date +%s) - start )) s)"; tail -10 $res/ab.log
cd $OUT && tar czf r.tgz r && rm -rf r

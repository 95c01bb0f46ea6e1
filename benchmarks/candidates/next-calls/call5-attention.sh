#!/usr/bin/env bash
# A later session's attention call (after call3-sweep.sh on the same machine, the bundle installed there; carry main's extension,
# .offline-bundle/install.sh, env.sh, bundle.sha256): issue #11's attention wave against FA3 where it missed 1.2x:
# batch 8 at its default 17 splits (136 partial tasks for 132 SMs) and at 16 (PERF_LOG #59), and batch 64 at 1K
# and 8K (the combine by column on main since session O: batch 64's combine tasks 10.6 -> 3.6 us kernel alone);
# batch 1 at 8K (the whole attention under 10 us?) with 128 and 64 splits.
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
start=$(date +%s)
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
bench() {  # name batches contexts splits
  timeout $(( 580 - ($(date +%s) - start) )) python -m benchmarks.attention_bench --model configs/north-mini-code \
    --batch-sizes $2 --contexts $3 --attn-splits $4 --out $res/$1 > $res/$1.log 2>&1
  echo "$1 rc=$? ($(( $(date +%s) - start )) s)"; cat $res/$1/table.md
}
bench b8-splits 8 1024,8192,32768 0,16
bench b1-splits 1 8192 0,64
bench b64-main 64 1024,8192 0
cd $OUT && tar czf r.tgz r && rm -rf r

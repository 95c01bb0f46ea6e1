#!/usr/bin/env bash
# A later session's attention call (after call3-sweep.sh on the same machine, the bundle installed there; carry main's extension,
# variants/cc.so and op.so, .offline-bundle/install.sh, env.sh, bundle.sha256): issue #11's attention wave against FA3 where
# it missed 1.2x: batch 8 at its default 17 splits (136 partial tasks for 132 SMs) and at 16 (PERF_LOG #59), and
# batch 64 at 1K and 8K on main and on cc (attn-combine-by-column, #81: batch 64's combine tasks ran ~10 us);
# batch 1 at 8K (the whole attention under 10 us?) with 128 and 64 splits, and on op (attn-combine-one-pass, #85).
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
start=$(date +%s)
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
bench() {  # name batches contexts splits
  timeout $(( 580 - ($(date +%s) - start) )) python -m benchmarks.attention_bench --model configs/north-mini-code \
    --batch-sizes $2 --contexts $3 --attn-splits $4 --out $res/$1 > $res/$1.log 2>&1
  echo "$1 rc=$? ($(( $(date +%s) - start )) s)"; cat $res/$1/table.md
}
bench b8-splits 8 1024,8192,32768 0,16
bench b1-splits 1 8192 0,64
bench b64-main 64 1024,8192 0
cp variants/cc.so $so; bench b64-cc 64 1024,8192 0
cp variants/op.so $so; bench b1-op 1 8192 0; cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

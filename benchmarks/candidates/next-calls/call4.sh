#!/usr/bin/env bash
# A later session, device call 4 (after the stash calls (one per bundle piece) on the same machine; carry main's extension,
# .offline-bundle/install.sh, env.sh, bundle.sha256): issue #12's missing long-context points, `decode_sweep` at the
# batch sizes given first and one context: `bash call4.sh BATCHES [CONTEXT] [SIDES]` (default 131072, both sides in
# one run; each case prefills its prompts once for the warm-up). Session AC's `call4.sh 8,16 131072` ran out of its
# 585 s in stock's batch-16 prefill (16 x 128K tokens) with only stock's batch 8 done (~7 min with its engine
# start), so from 128K batch 8 up: one case and one side a call, the two sides in consecutive calls on the same
# machine, e.g. `bash call4.sh 8 131072 megakernel` then `bash call4.sh 8 131072 stock`; 256K at batch 8 likewise.
set -u
export PYTHONUNBUFFERED=1
batches=${1:?batch sizes}; context=${2:-131072}; sides=${3:-stock,megakernel}
res=$OUT/r; mkdir -p $res
start=$(date +%s)
source benchmarks/candidates/next-calls/bundle-env.sh $res
timeout $(( 585 - ($(date +%s) - start) )) python -m benchmarks.decode_sweep --model configs/north-mini-code \
  --load-format dummy --sides $sides --batch-sizes $batches --contexts $context --new-tokens 128 --cache-prompts \
  --out $res/sweep > $res/sweep.log 2>&1
echo "sweep rc=$? ($(( $(date +%s) - start )) s)"; cat $res/sweep/table.md
cd $OUT && tar czf r.tgz r && rm -rf r

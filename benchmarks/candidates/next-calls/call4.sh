#!/usr/bin/env bash
# A later session, device call 4 (after five stash calls on the same machine; carry main's extension,
# .offline-bundle/install.sh, env.sh, bundle.sha256): issue #12's missing long-context points, both sides in one
# run: 128K at the batch sizes given first (e.g. 1,2,4 here, 8,16 in another call: each case prefills its
# prompts once for the warm-up), and 256K at batch 8 with `bash call4.sh 8 262144`.
set -u
export PYTHONUNBUFFERED=1
batches=${1:?batch sizes}; context=${2:-131072}
res=$OUT/r; mkdir -p $res
start=$(date +%s)
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout $(( 585 - ($(date +%s) - start) )) python -m benchmarks.decode_sweep --model configs/north-mini-code \
  --load-format dummy --batch-sizes $batches --contexts $context --new-tokens 128 --cache-prompts --out $res/sweep \
  > $res/sweep.log 2>&1
echo "sweep rc=$? ($(( $(date +%s) - start )) s)"; cat $res/sweep/table.md
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Next session, issue #12's long-context points one side a call (after the six stash calls on the same machine;
# carry vllm_megakernel/_C*.so, .offline-bundle/install.sh, env.sh, bundle.sha256). Session AC's call 3 ran
# `call4.sh 8,16 131072` (both sides in one run): stock's batch 8 took ~7 min with its engine start and its batch
# 16 prefill (16 x 128K tokens) did not end within 585 s, so one case and one side a call, the two sides in
# consecutive calls on the same machine: `bash call-long-context-side.sh SIDE BATCH CONTEXT`.
set -u
export PYTHONUNBUFFERED=1
side=${1:?stock or megakernel}; batch=${2:?batch}; context=${3:?context}
res=$OUT/r-$side-$batch-$context; mkdir -p $res; start=$(date +%s)
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout $(( 585 - ($(date +%s) - start) )) python -m benchmarks.decode_sweep --model configs/north-mini-code \
  --load-format dummy --sides $side --batch-sizes $batch --contexts $context --new-tokens 128 --cache-prompts \
  --out $res/sweep > $res/sweep.log 2>&1
echo "sweep rc=$? ($(( $(date +%s) - start )) s)"; cat $res/sweep/table.md
cd $OUT && tar czf r-$side-$batch-$context.tgz r-$side-$batch-$context && rm -rf r-$side-$batch-$context

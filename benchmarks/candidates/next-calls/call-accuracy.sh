#!/usr/bin/env bash
# Next session, issue #12 item 4's accuracy (after the five stash calls; carry vllm_megakernel/_C*.so,
# .offline-bundle/install.sh, env.sh, bundle.sha256): `benchmarks.accuracy` (lm-eval's local tasks and 256-token
# greedy agreement) on the 5-layer random checkpoint, one side per call: `bash call-accuracy.sh SIDE [SECONDS]`;
# then `python -m benchmarks.accuracy --model /tmp/nmc-5l --out DIR --sides ""` joins both sides' files.
set -u
export PYTHONUNBUFFERED=1
side=${1:?stock or megakernel}; limit=${2:-570}
res=$OUT/r; mkdir -p $res; start=$(date +%s)
source benchmarks/candidates/next-calls/bundle-env.sh $res
[ -f /tmp/nmc-5l/.complete ] || python -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l \
  --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
timeout $(( limit - ($(date +%s) - start) )) python -m benchmarks.accuracy --model /tmp/nmc-5l --out $res/accuracy \
  --sides $side > $res/accuracy-$side.log 2>&1
echo "accuracy $side rc=$? ($(( $(date +%s) - start )) s)"; tail -8 $res/accuracy-$side.log
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Next session, issue #12 item 4 (after the five stash calls on the same machine; carry vllm_megakernel/_C*.so,
# .offline-bundle/install.sh, env.sh, bundle.sha256): `benchmarks.serve_load`, one side per call on a 1-GPU
# machine (or both sides at once on nvidia-h200-x2 with CUDA_VISIBLE_DEVICES 0 / 1 and ports 8199 / 8200), its
# warm-up wave, concurrency 1, 4, 8, 32, 64, prompts of INPUT_LEN tokens:
# `bash call-serve.sh SIDE INPUT_LEN [SECONDS]`; afterwards `python -m benchmarks.serve_load ... --sides ""` on the
# CPU machine writes serve.md from both sides' files.
set -u
export PYTHONUNBUFFERED=1
side=${1:?stock or megakernel}; len=${2:?input length}; limit=${3:-570}
res=$OUT/r; mkdir -p $res; start=$(date +%s)
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout $(( limit - ($(date +%s) - start) )) python -m benchmarks.serve_load --model configs/north-mini-code \
  --load-format dummy --concurrency 1,4,8,32,64 --input-len $len --output-len 256 --sides $side \
  --out $res/serve-$len > $res/serve-$side-$len.log 2>&1
echo "serve_load $side $len rc=$? ($(( $(date +%s) - start )) s)"; tail -12 $res/serve-$side-$len.log
cd $OUT && tar czf r.tgz r && rm -rf r

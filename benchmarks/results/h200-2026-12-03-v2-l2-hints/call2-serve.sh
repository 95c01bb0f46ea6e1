#!/usr/bin/env bash
# Session S, device call 2 (after the five stash calls on the same machine; carry vllm_megakernel/_C*.so built from
# main's csrc/, .offline-bundle/install.sh, env.sh, bundle.sha256): issue #12 item 4's serving load on the v2 kernel,
# both sides one after the other on one H200: `benchmarks.serve_load` with its warm-up wave, concurrency 1, 4, 8,
# 32, 64, prompts of INPUT_LEN tokens, 256 output tokens. `bash call2-serve.sh INPUT_LEN [SECONDS]`
set -u
export PYTHONUNBUFFERED=1
len=${1:?input length}; limit=${2:-570}
res=$OUT/r; mkdir -p $res; start=$(date +%s)
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$? ($(( $(date +%s) - start )) s)"
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout $(( limit - ($(date +%s) - start) )) python -m benchmarks.serve_load --model configs/north-mini-code \
  --load-format dummy --concurrency 1,4,8,32,64 --input-len $len --output-len 256 --sides stock,megakernel \
  --out $res/serve-$len > $res/serve-$len.log 2>&1
echo "serve_load $len rc=$? ($(( $(date +%s) - start )) s)"; cat $res/serve-$len/serve.md 2>/dev/null || tail -12 $res/serve-$len.log
cd $OUT && tar czf r.tgz r && rm -rf r

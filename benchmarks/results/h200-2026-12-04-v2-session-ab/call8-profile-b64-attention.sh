#!/usr/bin/env bash
# Session AB, device call 8, as it ran (one command line; after the six stash calls on the same machine; carry
# vllm_megakernel/_C*.so built from main, .offline-bundle/install.sh, env.sh, bundle.sha256): the kernel alone at
# batch 64 (issue #10), then issue #11's attention grid against FlashAttention 3 on the current kernel.
res=$OUT/r; mkdir -p $res; s=$(date +%s)
timeout 40 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 64 --iters 10 \
  --out $res/profile-b64 > $res/profile-b64.log 2>&1; echo "b64 rc=$? $(( $(date +%s)-s )) s"
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$? $(( $(date +%s)-s )) s"
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout $(( 150 - ($(date +%s)-s) )) python -m benchmarks.attention_bench --model configs/north-mini-code --batch-sizes 1,8,64 \
  --contexts 1024,8192,32768,131072 --long-context 262144 --out $res/attention > $res/attention.log 2>&1
echo "attention rc=$? $(( $(date +%s)-s )) s"; cat $res/attention/table.md 2>/dev/null | tail -40
cd $OUT && tar czf r.tgz r && rm -rf r

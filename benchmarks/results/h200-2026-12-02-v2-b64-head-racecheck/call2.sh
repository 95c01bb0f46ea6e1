#!/usr/bin/env bash
# Session M, device call 2 (after five `install.sh --stash .offline-bundle/pN` calls on the same machine, N = 0..4,
# each carrying .offline-bundle/pN and .offline-bundle/install.sh; this call carries the extension,
# .offline-bundle/install.sh, env.sh and bundle.sha256): inside vLLM at 8K, both sides in one run, at the batch
# sizes given as the first argument (e.g. 64,8,1). First the batch-64 step tests on the new default schedule
# (the MoE combine folded into the norm and each QKV tile split in two batch-row slices, layout.HEAD_SPLIT_FROM_BATCH).
set -u
export PYTHONUNBUFFERED=1
batches=${1:?batch sizes}
res=$OUT/r; mkdir -p $res
start=$(date +%s)
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l PYTHONPATH=$PWD timeout 100 python3 -m pytest -q -rA -p no:cacheprovider \
  tests/gpu/test_megakernel_step.py -k "wide_step or batch_64 or folded or qkv_split" > $res/tests-b64.txt 2>&1
echo "b64 tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-b64.txt
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
timeout $(( 590 - ($(date +%s) - start) )) python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy \
  --batch-sizes $batches --contexts 8192 --new-tokens 256 --cache-prompts --out $res/sweep > $res/sweep.log 2>&1
echo "sweep rc=$?"; cat $res/sweep/table.md
cd $OUT && tar czf r.tgz r && rm -rf r

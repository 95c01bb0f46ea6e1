#!/usr/bin/env bash
# A later call (after the five stash calls on the same machine; carry main's extension, .offline-bundle/install.sh,
# env.sh, bundle.sha256): the vLLM-stage GPU tests on the current kernel, which last ran on c0d3a9b's and the kernel
# before it (README's status): each decode step against stock vLLM on identical inputs, 256 greedy tokens through
# both CUDA-graph modes, the switch-off / fallback equivalence, the OpenAI server. Wanted before
# options.AUTOMATIC_DEFAULT is turned on (the setup that leaves `enabled` out would then run the megakernel).
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
start=$(date +%s); limit=${1:-570}
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
python -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
for t in test_vllm_megakernel_e2e test_stock_equivalence test_serve; do
  left=$(( limit - ($(date +%s) - start) )); [ $left -lt 60 ] && { echo "$t: no time left"; continue; }
  MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout $left python -m pytest -q -rA -p no:cacheprovider --durations=5 \
    tests/gpu/$t.py > $res/$t.txt 2>&1
  echo "$t rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/$t.txt; grep -E "^(FAILED|ERROR)" $res/$t.txt | head -5
done
cd $OUT && tar czf r.tgz r && rm -rf r

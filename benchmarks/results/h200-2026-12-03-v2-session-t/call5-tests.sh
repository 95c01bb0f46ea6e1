#!/usr/bin/env bash
# Call 5 (after the six stash calls on the same machine; carry vllm_megakernel/_C*.so of this commit's csrc/,
# .offline-bundle/install.sh, env.sh, bundle.sha256): the kernel tests with the live split cap on by default
# (batch 1-8), then the vLLM-stage stepwise tests against stock (the first vLLM-stage run on the L2-hint kernel
# and on the cap). `bash call5-tests.sh [SECONDS]` (default 480: the kernel tests get up to 170 s).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-480}
timeout 170 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_each_opcode.py \
  tests/gpu/test_megakernel_step.py > $res/kernel-tests.txt 2>&1
echo "kernel tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/kernel-tests.txt; grep -E "^FAILED" $res/kernel-tests.txt | head -6
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
source .offline-bundle/env.sh
python -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
left=$(( limit - ($(date +%s) - start) ))
MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout $left python -m pytest -v -rA -p no:cacheprovider --durations=5 \
  tests/gpu/test_vllm_megakernel_e2e.py -k each_decode_step > $res/vllm-each-step.txt 2>&1
echo "vllm each_decode_step rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/vllm-each-step.txt
grep -E "^(PASSED|FAILED|ERROR)" $res/vllm-each-step.txt | head -12
cd $OUT && tar czf r.tgz r && rm -rf r

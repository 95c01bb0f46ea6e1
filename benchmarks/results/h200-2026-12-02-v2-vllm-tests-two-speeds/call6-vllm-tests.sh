#!/usr/bin/env bash
# A later call (after the five stash calls on the same machine; carry main's extension, .offline-bundle/install.sh,
# env.sh, bundle.sha256): the vLLM-stage GPU tests on the current kernel, which last ran on c0d3a9b's and the kernel
# before it (README's status): each decode step against stock vLLM on identical inputs, 256 greedy tokens through
# both CUDA-graph modes, the switch-off / fallback equivalence, the OpenAI server. Wanted before
# options.AUTOMATIC_DEFAULT is turned on (the setup that leaves `enabled` out would then run the megakernel).
# `bash call6-vllm-tests.sh [SECONDS] [FILE[:K] ...]` (default 570 s and the three files; K a pytest -k
# expression). Session P's run of all three in 490 s got through the 6 stepwise cases of
# test_vllm_megakernel_e2e.py only (the two greedy runs took 271 s together on c0d3a9b's kernel), so:
# `call6-vllm-tests.sh 570 test_vllm_megakernel_e2e:each_decode_step`, then
# `call6-vllm-tests.sh 570 test_vllm_megakernel_e2e:greedy test_stock_equivalence test_serve`.
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
start=$(date +%s); limit=${1:-570}; shift $(( $# > 0 ? 1 : 0 ))
tests=("$@"); [ ${#tests[@]} -eq 0 ] && tests=(test_vllm_megakernel_e2e test_stock_equivalence test_serve)
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
python -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
for t in "${tests[@]}"; do
  left=$(( limit - ($(date +%s) - start) )); [ $left -lt 60 ] && { echo "$t: no time left"; continue; }
  file=${t%%:*}; k=${t#*:}; sel=(); [ "$k" != "$t" ] && sel=(-k "$k"); log=$res/${t//[: ]/-}.txt
  MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout $left python -m pytest -v -rA -p no:cacheprovider --durations=5 \
    tests/gpu/$file.py "${sel[@]}" > $log 2>&1
  echo "$t rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $log; grep -E "^(PASSED|FAILED|ERROR)" $log | head -12
done
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# This session's vLLM-stage calls (after the five stash calls on the same machine; carry main's extension,
# .offline-bundle/install.sh, env.sh, bundle.sha256): call6-vllm-tests.sh's body (install --no-project, the 5-layer
# checkpoint, the named tests, each under what is left of TEST_SECONDS), then, with what is left of ALL_SECONDS,
# issue #11's attention wave against FA3 at batch 8 with its default split count (17: 136 partial tasks for 132 SMs)
# and 16 (PERF_LOG #59), at 1K / 8K / 32K.
# `bash call-tests-attn.sh TEST_SECONDS ALL_SECONDS FILE[:K] ...`
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
start=$(date +%s); limit=$1; all=$2; shift 2
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
python -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
for t in "$@"; do
  left=$(( limit - ($(date +%s) - start) )); [ $left -lt 60 ] && { echo "$t: no time left"; continue; }
  file=${t%%:*}; k=${t#*:}; sel=(); [ "$k" != "$t" ] && sel=(-k "$k"); log=$res/${t//[: ]/-}.txt
  MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout $left python -m pytest -v -rA -p no:cacheprovider --durations=5 \
    tests/gpu/$file.py "${sel[@]}" > $log 2>&1
  echo "$t rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $log; grep -E "^(PASSED|FAILED|ERROR)" $log | head -12
done
left=$(( all - ($(date +%s) - start) ))
if [ $left -gt 60 ]; then
  timeout $left python -m benchmarks.attention_bench --model configs/north-mini-code --batch-sizes 8 \
    --contexts 8192,1024,32768 --attn-splits 0,16 --out $res/b8-splits > $res/b8-splits.log 2>&1
  echo "b8-splits rc=$? ($(( $(date +%s) - start )) s)"; cat $res/b8-splits/table.md 2>/dev/null || tail -5 $res/b8-splits.log
fi
cd $OUT && tar czf r.tgz r && rm -rf r

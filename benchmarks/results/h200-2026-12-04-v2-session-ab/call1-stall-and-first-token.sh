#!/usr/bin/env bash
# Next session, after the six stash calls on the same machine (carry .offline-bundle/install.sh, env.sh,
# bundle.sha256 and vllm_megakernel/_C*.so built from main), one call of ~350 s:
#   1. the stall test alone (session AA fixed its script twice on the CPU: the tables' in-place edit under
#      inference mode, and any task the victim holds up accepted as the reporter);
#   2. `benchmarks.step_profile --phase prefill` at batch 1 and 1K, both sides: the decoder's Python launches,
#      table rebuilds and stall-check host time during the first-token units (PERF_LOG #127).
# `bash call-stall-and-first-token.sh [SECONDS]` (default 570). Logs in $OUT.
set -u
limit=${1:-570}; start=$(date +%s)
left() { echo $(( limit - ($(date +%s) - start) )); }
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $OUT/install.txt 2>&1; echo "install rc=$?"
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout $(( $(left) - 330 )) bash tests/gpu/run_on_gpu_host.sh graphs -k stall
echo "stall test rc=$? ($(( $(date +%s) - start )) s)"
grep -h -A40 "^E   \|stall_in_graph.py exited" $OUT/stall.log | head -60
name=prefill-b1-1024
timeout $(( $(left) - 10 )) python -m benchmarks.step_profile --model configs/north-mini-code --load-format dummy \
  --phase prefill --prefill-batch 1 --batch 1 --context 1024 --steps 16 --out $OUT/$name > $OUT/$name.log 2>&1
echo "step_profile rc=$? ($(( $(date +%s) - start )) s)"
rm -rf $OUT/$name/*-trace
grep -h "^#\|median\|During" $OUT/$name/table.md | cut -c1-600

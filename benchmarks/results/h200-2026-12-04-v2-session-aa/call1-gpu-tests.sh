#!/usr/bin/env bash
# Next session, after the six stash calls on the same machine (carry .offline-bundle/install.sh, env.sh,
# bundle.sha256 and vllm_megakernel/_C*.so built from main): the GPU tests session Z left unrun or failed on the
# landed kernel, in one call (~300-400 s):
#   1. test_stall_reporting_in_vllm.py (failed in session Z with no output kept; it now prints the script's stages,
#      exit code and output) and the 256-token greedy test with vLLM's default graphs, FULL_AND_PIECEWISE (graphs stage);
#   2. the 128k stepwise case (vllm stage; cut by session Z's time limit, the other four passed).
# `bash call-gpu-tests-after-z.sh [SECONDS]` (default 570). Logs: graphs.log, stall.log, stepwise.log in $OUT.
set -u
limit=${1:-570}; start=$(date +%s)
left() { echo $(( limit - ($(date +%s) - start) )); }
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $OUT/install.txt 2>&1; echo "install rc=$?"
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
# run_on_gpu_host.sh passes the extra args to each of a stage's pytest runs; pytest keeps the last -k
timeout $(( $(left) - 200 )) bash tests/gpu/run_on_gpu_host.sh graphs -k "stall or vllm-default"
echo "graphs stage rc=$? ($(( $(date +%s) - start )) s)"
grep -h -A60 "^E   \|AssertionError\|stall_in_graph.py exited" $OUT/stall.log | head -80
timeout $(( $(left) - 5 )) bash tests/gpu/run_on_gpu_host.sh vllm -k 128k  # equivalence deselects itself
echo "vllm stage (128k) rc=$? ($(( $(date +%s) - start )) s)"

#!/usr/bin/env bash
# Session Z call 2 (after the six stash calls; carry .offline-bundle/install.sh, env.sh, bundle.sha256 and
# vllm_megakernel/_C*.so, here variants/pcorel.so copied there): the graphs stage's greedy test in FULL_DECODE_ONLY
# and the stall test inside vLLM's CUDA graphs (session Y's shared stall record). Exact command of the call:
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $OUT/install.txt 2>&1; echo install rc=$?
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 540 bash tests/gpu/run_on_gpu_host.sh graphs -k "stall or full-decode"; echo rc=$?

#!/usr/bin/env bash
# Session Z call 4 (same machine and carry as call 2): the vllm stage (stock equivalence with the switch off, then
# the step-by-step comparison with stock vLLM), cut at 330 s by the budget. Exact command of the call:
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $OUT/install.txt 2>&1; echo install rc=$?
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 330 bash tests/gpu/run_on_gpu_host.sh vllm; echo rc=$?

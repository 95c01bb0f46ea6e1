#!/usr/bin/env bash
# After the stash calls (one per bundle piece) on the same machine (carry vllm_megakernel/_C*.so built from main and
# .offline-bundle/install.sh, env.sh, bundle.sha256): one stage of the GPU tests that run inside vLLM on the
# current kernel, `bash call-vllm-tests.sh STAGE [SECONDS] [pytest args]` with STAGE vllm (switch-off
# equivalence, step by step against stock vLLM, 128K included) or graphs (256 greedy tokens through both
# CUDA-graph modes, a stall inside a replayed graph). ~300-400 s a stage. Logs in $OUT/STAGE/.
set -u
stage=${1:?vllm or graphs}; limit=${2:-570}; shift 2 || shift $#
start=$(date +%s)
source benchmarks/candidates/next-calls/bundle-env.sh $OUT
export OUT=$OUT/$stage; mkdir -p $OUT
timeout -k 10 $(( limit - ($(date +%s) - start) )) bash tests/gpu/run_on_gpu_host.sh $stage "$@"
echo "$stage stage rc=$? ($(( $(date +%s) - start )) s)"

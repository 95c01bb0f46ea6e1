#!/usr/bin/env bash
# Next session, the kernel alone (no vLLM, no stash calls; carry vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
# built from main and .sanitizer/ with the nvidia-cuda-sanitizer-api 13.5.25 wheel). Session AR turned posted routing
# and posted scores on at batch 2 (PERF_LOG #194, from #191's H200 A/B: -1.10 / -1.11% in two processes); nothing has
# run on that default yet. Either GPU.
# (0) compute-sanitizer's three tools on the batch-2 default (`4500-7-batch-2`: the top-k polls the routers' keys and
#     posts its work list, the producers poll the words);
# (1) every kernel test (test_megakernel_step.py, test_each_opcode.py; 92 ran in ~105 s on an H100), on the new default;
# (2) `benchmarks.ab.interleaved --copies 3` at batch 2, 8 rounds, an A/A control: main against nopr
#     (`posted_routing=0`, which takes posted scores off too) and nops (`posted_scores=0`);
# (3) kernel_profile at batch 1, 2, 8 and 64 (64 at 8K needs the H200's memory: an H100 leaves it out and says why).
# Predictions (#194): on an H200 nopr +0.5 to +1.5% at batch 2, nops +0.3 to +1%; on an H100 both within +-0.6%.
# `bash call-h200-kernel.sh [SECONDS]` (default 560; later stages are skipped on time). Results in $OUT/r.tgz.
set -u
source benchmarks/candidates/next-calls/call-lib.sh ${1:-560}
sanitize 4500-7-batch-2 200
kernel_tests 160
ab b2 2 80 --copies 3 nopr=posted_routing=0 nops=posted_scores=0
profile 1,2,8,64
pack_results

#!/usr/bin/env bash
# The correctness checks the current kernel still lacks, for an H100 (or either GPU; carry
# vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so built from main and .sanitizer/): compute-sanitizer's three
# tools on the 2-stages-in-flight case (synccheck on it was cut by session AP's time limit, since the look-ahead lane)
# and on the batch-1 posted-scores case, then the kernel tests of uniform / posted routing and posted scores
# (4266efa: the top-k waits on the router wave under uniform routing; 2bba79f: its poll through poll_bounded; the
# posted-scores step test now runs every
# batch with posted routing). The 128K stepwise test inside vLLM is its own call after the seven stash calls:
# `bash benchmarks/candidates/next-calls/call-vllm-tests.sh vllm 500 -k 128k`.
# `bash call-h100-checks.sh [SECONDS]` (default 560). Results in $OUT/r.tgz.
set -u
source benchmarks/candidates/next-calls/call-lib.sh ${1:-560}
sanitize 4500-7-pad-2-stages-in-flight 220
kernel_tests 100 -k "uniform or posted"
sanitize 4500-batch-1-posted-scores 150
pack_results

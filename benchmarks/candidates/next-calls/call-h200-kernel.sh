#!/usr/bin/env bash
# Next H200 session, the kernel alone (no vLLM, no stash calls; carry vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
# built from main; .sanitizer/ with the nvidia-cuda-sanitizer-api 13.5.25 wheel is optional). Session AQ shortened
# batch 1's routing chain on an H100: the top-k's early post (9a53a94, PERF_LOG #189) and posted scores (3a3a8fd,
# ABI 20, #190; on at batch 1), both under main's default posted routing; none of it has run on an H200, where session
# AO measured posted routing off at batch 1 -0.77% against the control (#184, before both changes).
# The control runs up to ~0.6% from main in this harness (#186, #188): compare with main and with the control.
# (0) compute-sanitizer's three tools on the batch-1 posted-scores case (skipped with a message if .sanitizer/ was not
#     carried: session AQ ran them on the H100, 3 passed);
# (1) `benchmarks.ab.interleaved --copies 3` (every extension loaded three times, a variant's round the median over
#     its copies: session AQ added it against the ~0.6% a module's code placement moves a step) at batch 1, 12
#     rounds, one process with an A/A control: main (posted routing and
#     posted scores on) against nops (posted_scores=0), nopr (posted_routing=0: posted scores, which need it, off too) and u48
#     (moe_up_cols=48); batch 2: pr (posted_routing=1) and pspr (with posted scores, which need posted routing),
#     undecided on the H100 (#190);
# (2) the kernel tests of uniform and posted routing and posted scores: 4266efa and 2bba79f (the top-k waits on the router wave
#     under uniform routing even with posted scores; its poll through poll_bounded) have not run on a GPU;
# (3) kernel_profile at batch 1, 8 and 64, default schedule (issue #10's table). Batch 64 at 8K needs the H200's
#     memory: on an H100 kernel_profile leaves it out and says why.
# Predictions (#191): nops +1 to +2.5% at batch 1 (the routing chain passed ~half of a delay to the H200's step, #116);
# nopr 0 to +2.5% (nops's loss, less what posted routing alone cost there in #184); pr and pspr at batch 2 -0.5 to +0.5%.
# `bash call-h200-kernel.sh [SECONDS]` (default 560; later stages are skipped on time). Results in $OUT/r.tgz.
set -u
source benchmarks/candidates/next-calls/call-lib.sh ${1:-560}
sanitize 4500-batch-1-posted-scores 240
ab b1 1 170 --copies 3 nops=posted_scores=0 nopr=posted_routing=0 u48=moe_up_cols=48
ab b2 2 110 --copies 3 pr=posted_routing=1 pspr=posted_scores=1,posted_routing=1
kernel_tests 90 -k "uniform or posted"
profile 1,8,64
pack_results

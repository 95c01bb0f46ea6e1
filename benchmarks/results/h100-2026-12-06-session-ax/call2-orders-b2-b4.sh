#!/usr/bin/env bash
# Session AX, device call 2, as it ran (one command line on the warm H100 right after call-orders-recheck.sh; carry
# vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so built from main): the same wave orders at batch 2 and 4, one
# benchmarks.ab.interleaved process a batch with an A/A control. Results in $OUT/r.tgz.
source benchmarks/candidates/next-calls/call-lib.sh 200; ab b2 2 90 opbd=order=o_proj_before_down eba=order=experts_before_attention etc=order=experts_then_combine cbe=order=combine_before_experts; ab b4 4 90 opbd=order=o_proj_before_down eba=order=experts_before_attention etc=order=experts_then_combine; pack_results

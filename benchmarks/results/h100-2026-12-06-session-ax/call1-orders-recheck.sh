#!/usr/bin/env bash
# Session AX, the kernel alone (no vLLM, no stash calls; carry vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
# built from main). Issue #12 item 1 asks for the schedule choices to be made by measurement; the wave orders and
# batch 1's QKV / router task sizes were last compared on kernels many changes older than main's (orders: session D
# and session T's call 1; 40-row QKV with 4 router tasks at batch 1: PERF_LOG #50-#51, session I). This re-times
# them on main's kernel, one benchmarks.ab.interleaved process a batch with an A/A control, every variant a
# schedule on the same extension (outputs compared bit for bit by the tool):
#   batch 1: opbd (order=o_proj_before_down), eba (experts_before_attention), cbe (combine_before_experts),
#            etc (experts_then_combine), q40 (qkv_rows=40: 128 QKV tasks of 5 stages, the whole task in the ring),
#            q40r32 (q40 with 4 router tasks of 32 rows, batch 2-8's head of a layer)
#   batch 8: opbd, eba, etc
# Then tests/gpu/test_benchmark_tools_on_gpu.py (seconds; no committed result shows it run on a GPU).
# Predictions (PERF_LOG #213, written before the call): every order slower than main by more than the control's range
# at both batches; q40 +1 to +4%, q40r32 within +-1%.
# `bash call-orders-recheck.sh [SECONDS]` (default 400; later stages are skipped on time). Results in $OUT/r.tgz.
set -u
source benchmarks/candidates/next-calls/call-lib.sh ${1:-400}
ab b1 1 170 opbd=order=o_proj_before_down eba=order=experts_before_attention cbe=order=combine_before_experts \
  etc=order=experts_then_combine q40=qkv_rows=40 q40r32=qkv_rows=40,router_rows=32
ab b8 8 150 opbd=order=o_proj_before_down eba=order=experts_before_attention etc=order=experts_then_combine
timeout -k 5 60 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_benchmark_tools_on_gpu.py \
  > $res/bench-tools-test.txt 2>&1
stamp "benchmark tools test" $?; tail -1 $res/bench-tools-test.txt
pack_results

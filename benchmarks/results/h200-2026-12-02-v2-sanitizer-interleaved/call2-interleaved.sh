#!/usr/bin/env bash
# Next session, device call 2 (carry variants/ with base.so (= main), base2.so (a byte copy of base.so), prefad.so
# (0e4b823: the combine by column, before the per-lane releases) and sw.so, and probes/ with the nine d_<wave>.so
# signal-delay probes: ~42 MiB of extensions and the ~19 MiB tree, ~61 of the 64 MiB a call carries; no _C and
# no .sanitizer/: ab.interleaved launches the variants' own extensions).
# `bash call2-interleaved.sh a` runs part 1 (~450 s), `b` parts 2-3 (~330 s), no argument all of them.
# benchmarks.ab.interleaved's first GPU runs: every extension in one process on the same steps, rotated rounds,
# changes paired round by round, then one traced launch per variant (report.md: kernel_profile's per-wave tables,
# a row per variant).
# 1. at batch 1, 8, 64: an A/A pair (base, base2: the same code loaded twice, so its paired change and range are
#    the method's own noise, code placement included), prefad (what d818944's per-lane releases cost at batch 1
#    and 8, which session O could not tell in separate processes), sw, and main with 32-row QKV tiles (q32: at
#    batch 1 some SMs run two QKV tasks in a row, so the trace's split by previous opcode says whether the QKV
#    task's 3-4 us inputs phase is a cold start, code or data; PERF_LOG #83, #89).
#    Then the signal-delay probes at batch 1 and 8 (benchmarks/candidates/signal-delay: each holds one wave's
#    signals back 3 us; d_<wave>.so): which waves' completions sit on the layer's critical path, against the
#    timing model's prediction (signal-delay/predict_cpu.txt, PERF_LOG #90).
# 2. attention split counts decided on older kernels: batch 8 at 16 / 15 against the default 17 (136 partial tasks
#    on 132 SMs; PERF_LOG #59 predicted 16 -1 to -2%), batch 1 at 64 against 128.
# 3. batch 64 schedules: qkv_batch_split=4 (PERF_LOG #77: +0.4% against -2.5% predicted, never traced) and
#    moe_up_cols=48 (#86).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
run() {  # label, batches, limit, variants beyond the base...
  local label=$1 batches=$2 limit=$3; shift 3
  local extra=(); for v in "$@"; do extra+=(--variant "$v"); done
  timeout $limit python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $batches \
    --rounds 8 --iters 30 --variant base=variants/base.so "${extra[@]}" --out $res/$label > $res/$label.log 2>&1
  echo "$label rc=$? ($(( $(date +%s) - start )) s)"; cat $res/$label/table.md 2>/dev/null || tail -5 $res/$label.log
}
what=${1:-all}
if [ "$what" = all ] || [ "$what" = a ]; then
  run main 1,8,64 240 base2=variants/base2.so prefad=variants/prefad.so sw=variants/sw.so q32=variants/base.so@qkv_rows=32
  probes=(); for v in router router_topk qkv_rope attn_partial attn_combine moe_upgate moe_down o_proj moe_combine; do
    probes+=(d_$v=probes/d_$v.so); done
  run probes 1,8 200 "${probes[@]}"
fi
if [ "$what" = all ] || [ "$what" = b ]; then
  run splits-8 8 100 s16=variants/base.so@attn_splits=16 s15=variants/base.so@attn_splits=15
  run splits-1 1 80 s64=variants/base.so@attn_splits=64
  run head-64 64 140 qs4=variants/base.so@qkv_batch_split=4 u48=variants/base.so@moe_up_cols=48
fi
cd $OUT && tar czf r.tgz r && rm -rf r

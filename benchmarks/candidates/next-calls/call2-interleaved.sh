#!/usr/bin/env bash
# A later call (carry variants/ with base.so (= main) and probes/ with the nine d_<wave>.so signal-delay probes,
# rebuilt for ABI 12: ~34 MiB of extensions and the ~19 MiB tree; no _C: ab.interleaved launches the variants'
# own extensions). `bash call2-interleaved.sh a` runs part 1 (~200 s), `b` parts 2-3 (~330 s), no argument both.
# Session P ran the A/A pair, prefad, sw and q32 (results/h200-2026-12-02-v2-sanitizer-interleaved, call 2).
# 1. the signal-delay probes at batch 1 and 8 (benchmarks/candidates/signal-delay: each holds one wave's signals
#    back 3 us; d_<wave>.so) again: session P's ran in a process at batch 1's slow level (PERF_LOG #93), where the
#    router and top-k were on the critical path (+0.9 / +1.1 us a layer); the report's step level says which
#    level this process is at.
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

#!/usr/bin/env bash
# Next session, kernel alone (no vLLM): the signal-delay probes (benchmarks/candidates/signal-delay) on the current
# kernel. Before it, on the CPU machine (from the checkout root, HEAD committed):
#   args=; for op in ROUTER ROUTER_TOPK QKV_ROPE ATTN_PARTIAL ATTN_COMBINE MOE_UPGATE MOE_DOWN O_PROJ MOE_COMBINE; do
#     args="$args d_${op,,}=benchmarks/candidates/signal-delay/signal-delay-$op.patch"; done
#   PYTHON=/path/to/python3.12 bash benchmarks/ab/build.sh probes HEAD base $args
# and carry probes/ (ten extensions, ~34 MB; with the ~26 MB tree under the 64 MiB a call takes). Each probe holds
# one wave's signals back 3 us after its consumers finished; timed against base in one `ab.interleaved` process per
# batch, a probe that moves the step by ~3 us x 49 layers marks a wave whose completion reaches the layer's end, one
# that moves nothing a wave with slack (PERF_LOG #90's model: predict_cpu.txt). Batch 1's layer has two chains of
# about equal length (PERF_LOG #111-#112, #114): these say which waves to shorten next. `bash call-probes.sh [SECONDS]`
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-400}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
probes=(); for w in router router_topk qkv_rope attn_partial attn_combine moe_upgate moe_down o_proj moe_combine; do
  probes+=(--variant d_$w=probes/d_$w.so); done
for b in 1 8; do
  left=$(( limit - ($(date +%s) - start) - 10 )); [ $left -lt 60 ] && { echo "b$b: no time left"; continue; }
  timeout $left python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b --rounds 8 \
    --iters 30 --variant base=probes/base.so "${probes[@]}" --out $res/b$b > $res/b$b.log 2>&1
  echo "b$b rc=$? ($(( $(date +%s) - start )) s)"; cat $res/b$b/table.md 2>/dev/null || tail -5 $res/b$b.log
done
# every task's record of base's traced launch at batch 1 (traces.pt, ~1 MB), for reading offline with the
# trace module (layer_activity and the rest) without device time
cp probes/base.so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
left=$(( limit - ($(date +%s) - start) - 10 ))
[ $left -gt 40 ] && timeout $left python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1 \
  --iters 10 --save-traces --out $res/profile-b1 > $res/profile-b1.log 2>&1
echo "profile b1 rc=$? ($(( $(date +%s) - start )) s)"; ls $res/profile-b1 2>/dev/null
cd $OUT && tar czf r.tgz r && rm -rf r

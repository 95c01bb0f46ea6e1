#!/usr/bin/env bash
# As it ran in session AE's call 1 (`bash call1-after-acquire.sh 480`, on main's extension at 62c6545; 98 s); it was
# benchmarks/candidates/next-calls/call-after-acquire.sh.
# Next session, kernel alone (no vLLM, no stash calls; carry vllm_megakernel/_C*.so built from main, and
# build/fence_probe built by
#   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -o build/fence_probe \
#     benchmarks/candidates/fence-probe/fence_probe.cu
# ), PERF_LOG #146: (0) the fence probe with its hop set, which failed to launch in session AD (one dependency hop
# between two SMs by protocol: main's fenced signal and acquire poll, the acquire load, a data-flag store with no
# fence; ~10 s): whether a fence-free hand-over is worth designing; (1) launch and schedule choices re-timed on
# main's acquire loads (session AD: the waits no longer fence, so what the cap and the routing hops cost moved),
# one `benchmarks.ab.interleaved` process per batch with an A/A control: batch 1 c1 / c3 (stages_in_flight 1 / 3
# against the default 2), lr (local_routing), up48 / up24 (moe_up_cols 48 / 24 against 32), lf48 (live splits on
# SMs without QKV, 48 live tasks), cap96 (96 live attention tasks); batch 2 c2 / c5, lr; batch 4 lr, lf48, owd7
# (o_within_down 0.7), t32 (attn_max_tiles 32); batch 8 c4, owd (o_within_down 0.5), ce (combine_place
# empty_splits). These take in session AC's call-after-in-flight.sh and session T's call-tiles-on-cap.sh, whose
# kernels main has replaced; (2) kernel_profile at batch 64 on main (#10's third batch; batch 1 and 8 ran in
# session AD's call 1). `bash call-after-acquire.sh [SECONDS]` (default 480; ~300 s expected).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-480}
left() { echo $(( limit - ($(date +%s) - start) )); }
so=$(ls vllm_megakernel/_C*.so)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
timeout -k 5 60 build/fence_probe > $res/fence-probe.md 2>&1; echo "fence probe rc=$? ($(( $(date +%s) - start )) s)"
sed -n '/^| protocol/,$p' $res/fence-probe.md
run() {  # NAME BATCH SECONDS VARIANT=SCHEDULE...: one process, main against each schedule, with an A/A control
  local name=$1 b=$2 lim=$3; shift 3
  local l=$(( $(left) - 40 )); [ $lim -gt $l ] && lim=$l  # keep ~40 s for the profile
  [ $lim -lt 20 ] && { echo "$name: no time left"; return; }
  local args=(--variant base=$so)
  for v in "$@"; do args+=(--variant "${v%%=*}=$so@${v#*=}"); done
  timeout -k 5 $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds 6 --iters 20 --control "${args[@]}" --out $res/$name > $res/$name.log 2>&1
  echo "$name rc=$? ($(( $(date +%s) - start )) s)"; cat $res/$name/table.md 2>/dev/null || tail -3 $res/$name.log
}
run b1 1 110 c1=stages_in_flight=1 c3=stages_in_flight=3 lr=local_routing=1 up48=moe_up_cols=48 \
  up24=moe_up_cols=24 lf48=split_order=live_first,attn_live_tasks=48 cap96=attn_live_tasks=96
run b2 2 65 c2=stages_in_flight=2 c5=stages_in_flight=5 lr=local_routing=1
run b4 4 75 lr=local_routing=1 lf48=split_order=live_first,attn_live_tasks=48 owd7=o_within_down=0.7 \
  t32=attn_max_tiles=32
run b8 8 80 c4=stages_in_flight=4 owd=o_within_down=0.5 ce=combine_place=empty_splits
lim=$(( $(left) - 5 )); [ $lim -lt 20 ] && lim=20
timeout -k 5 $lim python3 -m benchmarks.kernel_profile \
  --model configs/north-mini-code --batch-sizes 64 --iters 10 --out $res/profile-b64 > $res/profile-b64.log 2>&1
echo "profile b64 rc=$? ($(( $(date +%s) - start )) s)"; grep -A3 "^| batch | context" $res/profile-b64/report.md | head -3
grep -E "^\| (qkv|mlp_up|mlp_down|o_proj|attn_partial) \|" $res/profile-b64/report.md | head -5
grep "spans of every wave" $res/profile-b64/report.md
cd $OUT && tar czf r.tgz r && rm -rf r

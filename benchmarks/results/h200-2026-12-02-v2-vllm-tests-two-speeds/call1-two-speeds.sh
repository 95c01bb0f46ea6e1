#!/usr/bin/env bash
# Next session, device call 1 (a fresh machine; carry vllm_megakernel/_C*.so = main (ABI 12), variants/base.so
# (= main) and variants/smid.so (main + benchmarks/candidates/sm-lists-by-smid.patch)): batch 1's two speeds
# (PERF_LOG #93). The same build ran batch 1 at 2515 us in one process and ~2775 in another (session P), the
# difference in the routing chain. Two tests in one call:
# (a) benchmarks.step_placements (its first GPU run): six steps of the default schedule in one process, each with
#     its own workspace, barriers and tables in segments of their own: do the step's own buffers set the level?
# (b) fresh processes, one after another until the time is up, each `benchmarks.ab.interleaved` at batch 1 with
#     main and smid (whose blocks take the task list of the physical SM they landed on): each traced launch keeps
#     the block -> physical SM map and the routing's physical SMs (ABI 12), and benchmarks.ab.processes puts the
#     processes side by side. (b) holds if main's level follows where its routing blocks sit; then smid's level
#     is the same in every process, and its paired change against main says which level the physical layout
#     of smid gives.
# Each process also times main with StepShape.routing_sms (SMs 0-15 / 0-16 hold each MoE layer's routing and
# nothing else of it; r17o32 with 64 O tasks of 32 rows for the 115 SMs left): does a routing on idle SMs that
# keep only its code shorten the chain (PERF_LOG #95)? The traces' router / top-k times and the experts' start say.
# `bash call1-two-speeds.sh [SECONDS]` (default 500).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s); limit=${1:-500}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
timeout 150 python3 -m benchmarks.step_placements --model configs/north-mini-code --batch-size 1 --steps 6 \
  --rounds 5 --iters 20 --out $res/placements > $res/placements.log 2>&1
echo "placements rc=$? ($(( $(date +%s) - start )) s)"; tail -12 $res/placements.log
k=0; runs=()
while [ $(( limit - ($(date +%s) - start) )) -gt 135 ]; do
  k=$((k + 1))
  timeout 130 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes 1 --rounds 6 \
    --iters 30 --variant base=variants/base.so --variant smid=variants/smid.so \
    --variant r16=variants/base.so@routing_sms=16 --variant r17=variants/base.so@routing_sms=17 \
    --variant r17o32=variants/base.so@routing_sms=17,o_rows=32 --out $res/p$k > $res/p$k.log 2>&1
  rc=$?; echo "process $k rc=$rc ($(( $(date +%s) - start )) s)"; grep "^| 1 |" $res/p$k/table.md 2>/dev/null
  [ $rc -eq 0 ] && runs+=($res/p$k)
done
python3 -m benchmarks.ab.processes "${runs[@]}" | tee $res/processes.md
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Next H200 session, the kernel alone (no vLLM, no stash calls; carry only
# vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so built from main). Session AN ran this script's first form on an
# H100 (PERF_LOG #180-#181): posted routing became batch 1's default there (-1.07 / -2.00%), o_prefetch lost (+1.05 /
# +1.15%), 48-column up/gate tiles gained nothing on top of posted routing. The H200 has not run either since session
# AE, and #179's reason for op (the H200's routing stretch holds ~25 MB of idle HBM, more than the O rows' 16.8 MB)
# is the H200's alone.
# (1) `benchmarks.ab.interleaved` at batch 1, one process with an A/A control: main (posted routing on) against nopr
# (posted_routing=0: main before 7d5a0ef), op (o_prefetch=1), u48 (moe_up_cols=48) and opu48 (both);
# (2) batch 2: op and pr (posted_routing=1); batch 4: op; (3) kernel_profile at batch 1, 8 and 64, default schedule
# (issue #10's table: each wave's bytes, span and share of the copy bandwidth measured in the run), with an
# o_prefetch=1 row beside each batch's if (1) ran (kernel_profile runs every schedule at every batch: 6 rows; a
# timeout keeps the rows already written). Batch 64 at 8K needs the H200's memory: on an H100 kernel_profile leaves it
# out and says why (49 GiB of K/V beside the weights).
# `bash call-h200-kernel.sh [SECONDS]` (default 560; later stages are skipped on time). Results in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-560}
left() { echo $(( limit - ($(date +%s) - start) )); }
stamp() { echo "$1 rc=$2 ($(( $(date +%s) - start )) s)"; }
so=vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
python3 -c "from vllm_megakernel import _C; print(_C.build_info())" | tee $res/build-info.txt
run() {  # NAME BATCH SECONDS NAME=SCHEDULE...: one process, main against each schedule, with an A/A control
  local name=$1 b=$2 lim=$3; shift 3
  [ $(left) -lt $(( lim + 5 )) ] && { echo "$name: skipped, $(left) s left"; return; }
  local args=(--variant base=$so)
  for v in "$@"; do args+=(--variant "${v%%=*}=$so@${v#*=}"); done
  timeout -k 5 $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds 10 --iters 20 --control "${args[@]}" --out $res/$name > $res/$name.log 2>&1
  stamp $name $?; cat $res/$name/table.md 2>/dev/null || tail -3 $res/$name.log
}
run b1 1 90 nopr=posted_routing=0 op=o_prefetch=1 u48=moe_up_cols=48 opu48=o_prefetch=1,moe_up_cols=48
run b2 2 55 op=o_prefetch=1 pr=posted_routing=1
run b4 4 55 op=o_prefetch=1
if [ $(left) -gt 60 ]; then
  schedules="default"; [ -f $res/b1/table.md ] && schedules="default;o_prefetch=1"
  # kernel_profile rewrites report.md after each row, so a timeout keeps the rows it finished
  timeout -k 5 $(( $(left) - 8 )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
    --batch-sizes 1,8,64 --iters 10 --schedules "$schedules" --out $res/profile > $res/profile.log 2>&1
  stamp profile $?
  if [ -f $res/profile/report.md ]; then
    grep -A8 "^| batch | context" $res/profile/report.md | head -9; grep "^spans of every wave" $res/profile/report.md
  else
    tail -3 $res/profile.log
  fi
else
  echo "profile: skipped, $(left) s left"
fi
cd $OUT && tar czf r.tgz r && rm -rf r

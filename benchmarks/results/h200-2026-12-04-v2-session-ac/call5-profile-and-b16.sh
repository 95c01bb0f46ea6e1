#!/usr/bin/env bash
# Session AC, call 5 (kernel alone; carry variants/cap.so, main's kernel with the runtime cap): issue #10's
# per-wave figures at batch 1 / 8 / 64 on the new default (batch 1 now 2 stages in flight), then call 2's cap
# grid at batch 16, which ran out of time there. `bash call5-profile-and-b16.sh [SECONDS]` (default 330).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-330}
so=variants/cap.so
cp $so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
timeout -k 5 120 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,8,64 --iters 10 \
  --save-traces --out $res/profile > $res/profile.log 2>&1
echo "profile rc=$? ($(( $(date +%s) - start )) s)"; grep -A5 "^| batch | context" $res/profile/report.md | head -5
grep "spans of every wave" $res/profile/report.md
timeout -k 5 $(( limit - ($(date +%s) - start) - 8 )) python3 -m benchmarks.ab.interleaved --model configs/north-mini-code \
  --batch-sizes 16 --rounds 6 --iters 20 --control --variant default=$so --variant c3=$so@stages_in_flight=3 \
  --variant c4=$so@stages_in_flight=4 --out $res/b16 > $res/b16.log 2>&1
echo "b16 rc=$? ($(( $(date +%s) - start )) s)"; cat $res/b16/table.md 2>/dev/null || tail -5 $res/b16.log
rm -f $res/profile/traces.pt.unused
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# The kernel alone (no vLLM, no stash calls; carry vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so built from main):
# `benchmarks.kernel_profile` at the given batches and 8K, one process, for issue #10's per-wave table (each wave's
# bytes, span and share of the copy bandwidth measured in the same run). `bash call-kernel-profile.sh [BATCHES] [SECONDS]`
# (default 1,8,64 / 300). Results in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
batches=${1:-1,8,64}; limit=${2:-300}
res=$OUT/r; mkdir -p $res; start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
python3 -c "from vllm_megakernel import _C; print(_C.build_info())" | tee $res/build-info.txt
t=$(( limit - 10 - ($(date +%s) - start) ))
[ $t -gt 0 ] || { echo "no time left for the profile ($t s)"; exit 2; }
timeout -k 5 $t python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
  --batch-sizes $batches --iters 10 --out $res/profile > $res/profile.log 2>&1
rc=$?; echo "profile rc=$rc ($(( $(date +%s) - start )) s)"
# kernel_profile rewrites report.md after each row, so a timeout keeps the rows it finished
if [ -f $res/profile/report.md ]; then grep -A5 "^| batch | context" $res/profile/report.md | head -6; else tail -5 $res/profile.log; fi
cd $OUT && tar czf r.tgz r && rm -rf r
exit $rc

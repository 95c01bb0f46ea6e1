#!/usr/bin/env bash
# Next session, device call 1 (a fresh machine, no vLLM needed; carry vllm_megakernel/_C*.so built from main's
# csrc/): PERF_LOG #97's step A/B that session R's calls 1 and 3 could not time (the tool's output check refused the
# ceiling's split count; since 226475f it compares a schedule variant's distance from the reference with the base
# schedule's own): batch 8, 7 and 5 in one `benchmarks.ab.interleaved` process each, the floor split count (main's
# default since b8204fd) against the ceiling's. Then `benchmarks.kernel_profile` at batch 1, 8 and 64 on main (issue
# #10's per-wave table on the current kernel; the top-k's trace marks moved in session R: inputs until the
# scores are loaded, stages until the rows' experts are chosen, PERF_LOG #99). First the kernel tests, since that
# commit touched csrc/ops/router.cuh (trace marks only). `bash call1-ab-splits.sh [SECONDS]` (default 560).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-560}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
so=$(ls vllm_megakernel/_C*.so)
MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 200 python3 -m pytest -q -rA -p no:cacheprovider \
  tests/gpu/test_each_opcode.py tests/gpu/test_megakernel_step.py > $res/kernel-tests.txt 2>&1
echo "kernel tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/kernel-tests.txt; grep -E "^FAILED" $res/kernel-tests.txt | head -6
for b in 8 7 5; do
  ceil=$(( (132 + b - 1) / b ))
  timeout 120 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b --rounds 8 \
    --iters 30 --variant floor=$so --variant ceil=$so@attn_splits=$ceil --out $res/ab-b$b > $res/ab-b$b.log 2>&1
  echo "ab batch $b (ceil $ceil) rc=$? ($(( $(date +%s) - start )) s)"; cat $res/ab-b$b/table.md 2>/dev/null || tail -5 $res/ab-b$b.log
done
left=$(( limit - ($(date +%s) - start) ))
[ $left -gt 60 ] && timeout $left python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
  --batch-sizes 1,8,64 --iters 20 --out $res/profile > $res/profile.log 2>&1
echo "profile rc=$? ($(( $(date +%s) - start )) s)"; head -30 $res/profile/report.md 2>/dev/null
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session R, device call 1 (a fresh machine, no vLLM needed; carry vllm_megakernel/_C*.so built from main's
# csrc/, with this checkout's Python side: layout.attn_splits_for = num_sms // batch, so batch 5 / 7 / 8 take
# 26 / 18 / 16 splits instead of the ceiling's 27 / 19 / 17).
# (1) the step at batch 8, 7 and 5, one `benchmarks.ab.interleaved` process each: the floor (the new default)
#     against the ceiling's split count (attn_splits=N), paired round by round (PERF_LOG #97);
# (2) the kernel's GPU tests (whole step against the reference, each opcode against torch) on the new default.
# `bash call1-kernel.sh [SECONDS]` (default 450).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s); limit=${1:-450}
left() { echo $(( limit - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
so=$(ls vllm_megakernel/_C*.so)
for b in 8 7 5; do
  ceil=$(( (132 + b - 1) / b ))
  timeout 110 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b --rounds 8 \
    --iters 30 --variant floor=$so --variant ceil=$so@attn_splits=$ceil --out $res/ab-b$b > $res/ab-b$b.log 2>&1
  echo "ab batch $b (ceil $ceil) rc=$? ($(( $(date +%s) - start )) s)"; cat $res/ab-b$b/table.md 2>/dev/null || tail -5 $res/ab-b$b.log
done
MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout $(( $(left) - 15 )) python3 -m pytest -q -rA -p no:cacheprovider \
  --durations=5 tests/gpu/test_each_opcode.py tests/gpu/test_megakernel_step.py > $res/kernel-tests.txt 2>&1
echo "kernel tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/kernel-tests.txt; grep -E "^FAILED|^E  +AssertionError" $res/kernel-tests.txt | head -6
cd $OUT && tar czf r.tgz r && rm -rf r

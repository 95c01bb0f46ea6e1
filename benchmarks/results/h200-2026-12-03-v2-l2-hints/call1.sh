#!/usr/bin/env bash
# Session S, device call 1 (a fresh machine, no vLLM; carry vllm_megakernel/_C*.so and variants/, built on the CPU
# machine by `benchmarks/ab/build.sh variants base ef=... opf=... efopf=... efopfq=...` from main's csrc/): the kernel tests
# on main (csrc/ops/router.cuh's trace marks and reference.vector_distance, not run on a GPU before), then
# PERF_LOG #101's A/B in one process per batch: base, ef (weights and K/V copied with an L2 evict-first policy),
# opf (the SM's O rows prefetched into L2 at its first expert place), efopf (both), efopfq (efopf, and at the SM's
# O place the next layer's QKV rows prefetched into L2), at batch 1 base2 (an A/A copy), at batch 8 ceil (PERF_LOG
# #97's 17 splits). `bash call1.sh [SECONDS]`
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-570}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 200 python3 -m pytest -q -rA -p no:cacheprovider \
  tests/gpu/test_each_opcode.py tests/gpu/test_megakernel_step.py > $res/kernel-tests.txt 2>&1
echo "kernel tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/kernel-tests.txt; grep -E "^FAILED" $res/kernel-tests.txt | head -6
V="--variant base=variants/base.so --variant ef=variants/ef.so --variant opf=variants/opf.so --variant efopf=variants/efopf.so --variant efopfq=variants/efopfq.so"
ab() {  # batch, extra variants
  local left=$(( limit - ($(date +%s) - start) - 5 )); [ $left -lt 40 ] && { echo "ab batch $1 skipped"; return; }
  timeout $left python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $1 --rounds 8 \
    --iters 30 $V $2 --out $res/ab-b$1 > $res/ab-b$1.log 2>&1
  echo "ab batch $1 rc=$? ($(( $(date +%s) - start )) s)"; cat $res/ab-b$1/table.md 2>/dev/null || tail -5 $res/ab-b$1.log
}
ab 1 "--variant base2=variants/base.so"
ab 8 "--variant ceil=variants/base.so@attn_splits=17"
ab 64 ""
cd $OUT && tar czf r.tgz r && rm -rf r

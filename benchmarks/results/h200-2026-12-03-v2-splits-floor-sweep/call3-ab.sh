#!/usr/bin/env bash
# Session R, device call 3 (kernel alone, no vLLM; carry vllm_megakernel/_C*.so built from main's csrc/): call 1's
# A/B again after benchmarks.ab.interleaved checks a variant of another schedule against the reference (call 1's
# check against the base's output refused the ceiling's split count at cosine 0.32-0.51, while call 2 found both
# split counts matching the reference). Batch 8, 7 and 5, one process each: the floor (the new default) against the
# ceiling's split count. `bash call3-ab.sh`
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
so=$(ls vllm_megakernel/_C*.so)
for b in 8 7 5; do
  ceil=$(( (132 + b - 1) / b ))
  timeout 120 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b --rounds 8 \
    --iters 30 --variant floor=$so --variant ceil=$so@attn_splits=$ceil --out $res/ab-b$b > $res/ab-b$b.log 2>&1
  echo "ab batch $b (ceil $ceil) rc=$? ($(( $(date +%s) - start )) s)"; cat $res/ab-b$b/table.md 2>/dev/null || tail -5 $res/ab-b$b.log
done
cd $OUT && tar czf r.tgz r && rm -rf r

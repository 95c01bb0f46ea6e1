#!/usr/bin/env bash
# Session V, device call 3 (after six `install.sh --stash .offline-bundle/pN` calls on the same machine, N = 0..5;
# carry vllm_megakernel/_C*.so (main's csrc/), .offline-bundle/install.sh, env.sh, bundle.sha256): issue #12's
# sweep inside vLLM at 8K, both sides in one run (vLLM's defaults: torch.compile, FULL_AND_PIECEWISE), on the
# current kernel (csrc/ as at 9df348d: the L2 hint, the live split cap, ABI 14; default schedule: batch 2 combines on empty splits, local routing off; PERF_LOG #110): `bash call3-sweep.sh [BATCHES] [SECONDS]` (default 1,2,4,8,16 and 560).
set -u
export PYTHONUNBUFFERED=1
batches=${1:-1,2,4,8,16}; limit=${2:-560}
res=$OUT/r; mkdir -p $res; start=$(date +%s)
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
timeout $(( limit - ($(date +%s) - start) )) python -m benchmarks.decode_sweep --model configs/north-mini-code \
  --load-format dummy --batch-sizes $batches --contexts 8192 --new-tokens 256 --cache-prompts --out $res/sweep > $res/sweep.log 2>&1
echo "sweep rc=$? ($(( $(date +%s) - start )) s)"; cat $res/sweep/table.md 2>/dev/null || tail -8 $res/sweep.log
cd $OUT && tar czf r.tgz r && rm -rf r

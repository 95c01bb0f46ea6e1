#!/usr/bin/env bash
# Session V, device call 5 (on call 3's machine, after its six `install.sh --stash .offline-bundle/pN` calls, N =
# 0..5; carry as call 3): issue #12's grid with `--uniform-routing` on both sides (vLLM's uniform_random routing
# simulation; the megakernel's step table uniform_routing), vLLM's defaults, on the current kernel (csrc/ as at
# 9df348d, default schedule): `bash call5-uniform.sh [BATCHES] [SECONDS] [CONTEXTS]` (run as `1,8 390 8192`).
set -u
export PYTHONUNBUFFERED=1
batches=${1:-1}; limit=${2:-560}; contexts=${3:-1024,32768,131072}
res=$OUT/r; mkdir -p $res; start=$(date +%s)
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
timeout $(( limit - ($(date +%s) - start) )) python -m benchmarks.decode_sweep --model configs/north-mini-code \
  --load-format dummy --batch-sizes $batches --contexts $contexts --new-tokens 256 --cache-prompts --uniform-routing --out $res/sweep > $res/sweep.log 2>&1
echo "sweep rc=$? ($(( $(date +%s) - start )) s)"; cat $res/sweep/table.md 2>/dev/null || tail -8 $res/sweep.log
cd $OUT && tar czf r.tgz r && rm -rf r

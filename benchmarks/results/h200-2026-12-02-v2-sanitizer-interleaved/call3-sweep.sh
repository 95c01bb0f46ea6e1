#!/usr/bin/env bash
# Next session, device call 3 (after five `install.sh --stash .offline-bundle/pN` calls on the same machine, N = 0..4,
# each carrying .offline-bundle/pN and .offline-bundle/install.sh; this call carries main's extension (or the
# winning variant's, copied over it first), .offline-bundle/install.sh, env.sh and bundle.sha256): inside vLLM
# at 8K, both sides in one run, at the batch sizes given (default 64,32): `bash call3-sweep.sh 64,32`.
set -u
export PYTHONUNBUFFERED=1
batches=${1:-64,32}
res=$OUT/r; mkdir -p $res
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
timeout 540 python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy \
  --batch-sizes $batches --contexts 8192 --new-tokens 256 --cache-prompts --out $res/sweep > $res/sweep.log 2>&1
echo "sweep rc=$?"; cat $res/sweep/table.md
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session R, device call 6 (same machine after call 5; carry vllm_megakernel/_C*.so, .offline-bundle/install.sh, env.sh,
# bundle.sha256): tests/gpu/test_serve.py with AUTOMATIC_DEFAULT on (the server leaves the megakernel key out, so
# its log line must say the megakernel takes batches 1 to MEASURED_MAX_BATCH), then the 8K sweep with
# --uniform-routing on both sides at the batch sizes given. `bash call6-serve-uniform.sh [BATCHES] [SECONDS]`
set -u
export PYTHONUNBUFFERED=1
batches=${1:-1,8}; limit=${2:-500}
res=$OUT/r; mkdir -p $res; start=$(date +%s)
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$? ($(( $(date +%s) - start )) s)"
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 200 python -m pytest -v -rA -s -p no:cacheprovider tests/gpu/test_serve.py > $res/serve.txt 2>&1
echo "serve rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/serve.txt; grep -E "^(PASSED|FAILED)|^decision:" $res/serve.txt | cut -c1-400
timeout $(( limit - ($(date +%s) - start) )) python -m benchmarks.decode_sweep --model configs/north-mini-code \
  --load-format dummy --batch-sizes $batches --contexts 8192 --new-tokens 256 --cache-prompts --uniform-routing \
  --out $res/sweep-uniform > $res/sweep-uniform.log 2>&1
echo "uniform sweep rc=$? ($(( $(date +%s) - start )) s)"; cat $res/sweep-uniform/table.md 2>/dev/null || tail -8 $res/sweep-uniform.log
cd $OUT && tar czf r.tgz r && rm -rf r

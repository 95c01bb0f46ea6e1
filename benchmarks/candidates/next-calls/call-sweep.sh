#!/usr/bin/env bash
# After the stash calls (one per bundle piece) on the same machine (carry vllm_megakernel/_C*.so built from main and
# .offline-bundle/install.sh, env.sh, bundle.sha256): issue #12's sweep inside vLLM, both sides in one run with
# vLLM's defaults (torch.compile, FULL_AND_PIECEWISE), dummy weights, prompts prefix-cached by the warm-up.
# Session AK ran it once (1,8 8192 405): both engines refused to start, the sweep's own process holding its 8 GB
# bandwidth buffers (fixed in sol.measure_bandwidth since); h100-2026-12-05-session-ak. Session AL ran
# `1,2,4,8 8192 560` (366 s); the device tool brings back at most 8 files, so it lost three of them: the results now
# come back as one archive. `bash call-sweep.sh [BATCHES] [CONTEXTS] [SECONDS] [DECODE_SWEEP FLAGS]` (default
# 1,8 / 8192 / 480 / none). Session AR ran `8 131072 590` (586 s): at 128K and batch 8 the prompts did not stay
# in the prefix cache, so every run of both sides prefilled again (42 s each, four a side). decode_sweep now runs
# its workers with VLLM_PREFIX_CACHE_RETENTION_INTERVAL=0, which a CPU replay of vLLM's scheduler showed keeps
# batch 8 and 16 cached at 128K (not yet run on a GPU); if the timed runs still take tens of seconds to their
# first token, `--repeats 1` as the fourth argument keeps batch 16 at 128K or 256K at batch 8 inside one call.
# Results in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1
batches=${1:-1,8}; contexts=${2:-8192}; limit=${3:-480}; flags=${4:-}
res=$OUT/r; mkdir -p $res; start=$(date +%s)
source benchmarks/candidates/next-calls/bundle-env.sh $res
python3 -c "from vllm_megakernel import _C; print(_C.build_info())" | tee $res/build-info.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
nvidia-smi --query-gpu=index,timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -l 5 \
  > $res/gpu-clocks.csv 2>&1 & clocks=$!  # to compare with the servers' (PERF_LOG #174)
timeout $(( limit - ($(date +%s) - start) )) python -m benchmarks.decode_sweep --model configs/north-mini-code \
  --load-format dummy --batch-sizes $batches --contexts $contexts --new-tokens 256 --cache-prompts $flags \
  --out $res/sweep > $res/sweep.log 2>&1
rc=$?; kill $clocks 2>/dev/null
echo "sweep rc=$rc ($(( $(date +%s) - start )) s)"; cat $res/sweep/table.md 2>/dev/null || tail -8 $res/sweep.log
cd $OUT && tar czf r.tgz r && rm -rf r
exit $rc

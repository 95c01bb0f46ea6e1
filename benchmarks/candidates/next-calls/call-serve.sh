#!/usr/bin/env bash
# Next session, issue #12 item 4 (after the stash calls (one per bundle piece) on the same machine; carry vllm_megakernel/_C*.so,
# .offline-bundle/install.sh, env.sh, bundle.sha256): `benchmarks.serve_load`, one side per call on a 1-GPU
# machine (or both sides at once on nvidia-h200-x2 with CUDA_VISIBLE_DEVICES 0 / 1 and ports 8199 / 8200), its
# warm-up wave, concurrency 1, 4, 8, 32, 64, prompts of INPUT_LEN tokens:
# `bash call-serve.sh SIDES INPUT_LEN [SECONDS] [CONCURRENCY]` (default 1,4,8,32,64). Session X: both sides at 1K
# and every level did not fit 580 s (the megakernel side stopped before 32; engine init 50 s stock, 125 s
# megakernel; 35-60 s a level): give a call fewer levels. `python -m benchmarks.serve_load ... --sides ""` on the
# CPU machine writes serve.md again from the sides' files.
set -u
export PYTHONUNBUFFERED=1
side=${1:?stock or megakernel}; len=${2:?input length}; limit=${3:-570}; levels=${4:-1,4,8,32,64}
res=$OUT/r-$side-$len; mkdir -p $res; start=$(date +%s)
# one server size whatever the levels, so that sides run in separate calls with different levels compare (session AL's
# stock server had 64 and its megakernel server 32, serve_load having taken its largest level)
seqs=$(echo $levels | tr , '\n' | sort -n | tail -1); [ $seqs -lt 64 ] && seqs=64
source benchmarks/candidates/next-calls/bundle-env.sh $res
# the GPU's clocks, power and temperature every 5 s through the run (session AL's megakernel server, run last,
# decoded 1-4% slower than its sweep and no clock was recorded: PERF_LOG #174)
nvidia-smi --query-gpu=index,timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv -l 5 > $res/gpu-clocks.csv 2>&1 & clocks=$!
timeout $(( limit - ($(date +%s) - start) )) python -m benchmarks.serve_load --model configs/north-mini-code \
  --load-format dummy --concurrency $levels --input-len $len --output-len 256 --sides $side --max-num-seqs $seqs \
  --out $res/serve-$len > $res/serve-$side-$len.log 2>&1
echo "serve_load $side $len rc=$? ($(( $(date +%s) - start )) s)"; tail -12 $res/serve-$side-$len.log
kill $clocks 2>/dev/null
# serve_load stops its server on the time limit's SIGTERM since session AA; a server that still runs would
# answer the next call's /health in place of that call's own server (session AA's calls 2-4 measured one)
# (only a server on this run's port: serve_load's default, 8199)
pkill -f "vllm.entrypoints.cli.main serve .*--port 8199( |$)" && echo "a vllm server was still running: killed"
# one folder and archive per side and length, so that two runs in one call do not overwrite each other's
cd $OUT && tar czf r-$side-$len.tgz r-$side-$len && rm -rf r-$side-$len

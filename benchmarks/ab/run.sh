#!/usr/bin/env bash
# Kernel A/B, step 2 (the GPU host, from the checkout's root): time every variant built by build.sh in one
# process environment, on one machine, interleaved as given (name a base twice, first and last, to see the
# spread), then print the comparison table (benchmarks/ab/table.py: the first name is the base). The
# checkout's own extension is put back at the end.
#
#   bash benchmarks/ab/run.sh DIR OUT BATCHES NAME ...        # e.g. run.sh variants out 1,2,4,8 base T base
#
# Each run is `benchmarks.kernel_profile --schedules default` (kernel alone, 8K, random full-size weights)
# into OUT/<NAME>-<i>/, its printout in OUT/<NAME>-<i>.log.
set -uo pipefail
dir=${1:?usage: run.sh DIR OUT BATCHES NAME ...}; out=${2:?}; batches=${3:?}; shift 3
so=$(ls vllm_megakernel/_C*.so)
own=$(mktemp); cp "$so" "$own"
mkdir -p "$out"
runs=()
i=0
for name in "$@"; do
  i=$((i + 1)); run=$name-$i
  cp "$dir/$name.so" "$so"
  python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes "$batches" --iters 20 \
    --schedules default --out "$out/$run" > "$out/$run.log" 2>&1
  echo "$run: rc=$?"
  runs+=("$run")
done
cp "$own" "$so" && rm -f "$own"
python3 -m benchmarks.ab.table "$out" "${runs[@]}"

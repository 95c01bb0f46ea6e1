#!/usr/bin/env bash
# After session AI's H100 run (benchmarks/results/h100-2026-12-05-session-ai), on whatever GPU the device tool lends
# (carry variants/ with base.so and jw.so built from main as call-posted-routing.sh's header says, and
# build/tma_slice_probe, built as benchmarks/candidates/tma-slice-probe/tma_slice_probe.cu's header says, run first):
# (1) the flagged-residual step tests, whose words check session AI fixed after it failed on the x buffer the final
# norm overwrites (the fix has not run); (2) pr and jw against main at batch 1, 2, 4 and 8 in two processes each
# (session AI: both 0.3-1.4% faster in every process, neither beyond the control's range in both): land
# posted_routing_for or jw only where they clear it twice; at batch 1 also moe_up_cols=48 (u48: 128 up/gate tiles,
# one an SM, where 192 put two on 60 SMs that then end the layer, PERF_LOG #164; +0.7% on an older kernel; batch 2's
# default is 96 columns, 128 tiles already); (3) jw's whole kernel test run (130 s was not enough on
# the H100), for landing jw. `bash call-after-h100.sh [SECONDS]` (default 560; later stages skipped on time).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-560}
left() { echo $(( limit - ($(date +%s) - start) )); }
stamp() { echo "$1 rc=$2 ($(( $(date +%s) - start )) s)"; }
so=variants/base.so
cp $so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt; cat $res/gpu.txt
if [ -x build/tma_slice_probe ]; then  # PERF_LOG #166: what W2's column slices cost in HBM time (~65 GB read: ~30 s)
  timeout -k 5 90 build/tma_slice_probe > $res/tma-slice-probe.md 2>&1; stamp tma-slice-probe $?; cat $res/tma-slice-probe.md
else
  echo "tma-slice-probe: build/tma_slice_probe not carried, skipped"
fi
timeout -k 5 90 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py -k flagged_residual \
  > $res/flagged-tests.txt 2>&1
stamp flagged-tests $?; tail -1 $res/flagged-tests.txt; grep -E "^(FAILED|ERROR)" $res/flagged-tests.txt | head -4
for pass in 1 2; do
  for b in 1 2 4 8; do
    [ $(left) -lt 200 ] && { echo "ab pass $pass batch $b: skipped, $(left) s left"; continue; }
    u48=(); [ $b -eq 1 ] && u48=(--variant "u48=$so@moe_up_cols=48")  # PERF_LOG #164: one up/gate tile an SM
    timeout -k 5 80 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b --rounds 6 \
      --iters 20 --control --variant base=$so --variant jw=variants/jw.so --variant pr=$so@posted_routing=1 "${u48[@]}" \
      --out $res/ab$pass-b$b > $res/ab$pass-b$b.log 2>&1
    stamp "ab pass $pass batch $b" $?; grep -E "^\| [0-9]+ \| (control|jw|pr|u48) " $res/ab$pass-b$b.log
  done
done
if [ $(left) -gt 190 ]; then
  cp variants/jw.so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
  timeout -k 5 $(( $(left) - 10 )) python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_each_opcode.py \
    tests/gpu/test_megakernel_step.py -k "not flagged_residual" > $res/jw-kernel-tests.txt 2>&1
  stamp jw-kernel-tests $?; tail -1 $res/jw-kernel-tests.txt; grep -E "^(FAILED|ERROR)" $res/jw-kernel-tests.txt | head -4
  cp $so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
fi
cd $OUT && tar czf r.tgz r && rm -rf r

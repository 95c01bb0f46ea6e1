#!/usr/bin/env bash
# Next session, kernel alone (no vLLM). Carry vllm_megakernel/_C*.so (main's csrc/), .sanitizer/ (the
# nvidia-cuda-sanitizer-api 13.5.25 wheel) and variants/ with base.so (main) and st4.so, built on the CPU machine by
#   PYTHON=/path/to/python3.12 bash benchmarks/ab/build.sh variants HEAD base st4=benchmarks/candidates/ring-4-stages.patch
# (1) compute-sanitizer memcheck, racecheck and synccheck on tests/gpu/test_sanitizer.py's two default cases
# (4500-7-pad, ragged-to-128k), which have not run on ABI 14 (only its local-routing case has, session V; session U
# ran all six of its cases in 261 s). (2) PERF_LOG #117: main against st4 (a ring of 4 stages of 32 KB instead of 5)
# in one `benchmarks.ab.interleaved` process per batch at 8K: how much a task's stage phases depend on the bytes
# each SM keeps in flight. `bash call-sanitizer-ring.sh [SECONDS]` (default 420).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-420}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
w=$(ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl); d=/tmp/cs-13.5.25; rm -rf $d; python3 -m zipfile -e $w $d
chmod -R u+x $d/nvidia/cu13; cs=$d/nvidia/cu13/bin/compute-sanitizer
COMPUTE_SANITIZER=$cs timeout 270 python3 -m pytest -v -rA -p no:cacheprovider --durations=6 \
  tests/gpu/test_sanitizer.py -k "not local" > $res/sanitizer.txt 2>&1
echo "sanitizer rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer.txt
grep -E "^(PASSED|FAILED|ERROR)" $res/sanitizer.txt
for b in 1 2 8; do
  left=$(( limit - ($(date +%s) - start) - 10 )); [ $left -lt 40 ] && { echo "b$b: no time left"; continue; }
  timeout $left python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b --rounds 8 \
    --iters 30 --variant base=variants/base.so --variant st4=variants/st4.so --out $res/b$b > $res/b$b.log 2>&1
  echo "b$b rc=$? ($(( $(date +%s) - start )) s)"; cat $res/b$b/table.md 2>/dev/null || tail -5 $res/b$b.log
done
cd $OUT && tar czf r.tgz r && rm -rf r

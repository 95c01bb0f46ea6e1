#!/usr/bin/env bash
# Next session, kernel alone (no vLLM, no stash calls needed; carry variants/ with base.so, sif1.so, sif2.so,
# sif3.so, build/fence_probe and .sanitizer/), built on the CPU machine from main by
#   PYTHON=/path/to/python3.12 bash benchmarks/ab/build.sh variants HEAD base \
#     sif1=benchmarks/candidates/stages-in-flight-1.patch sif2=benchmarks/candidates/stages-in-flight-2.patch \
#     sif3=benchmarks/candidates/stages-in-flight-3.patch
#   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -o build/fence_probe \
#     benchmarks/candidates/fence-probe/fence_probe.cu
# PERF_LOG #133 / #134: (1) the probe: does a fence or an L2 load on an SM wait behind the bytes its own bulk copies
# have in flight (~10 s); (2) `benchmarks.ab.interleaved` at 8K, one process per batch (1, 2, 8): base against
# sifK (the producer keeps at most K stages of 32 KB in flight instead of the whole 5-stage ring) with an A/A
# control; (3) the traces of base and of the variant the rule below picks at batch 1 and 8 (the signaller's
# tails, the hops and the activation waits are what should move); (4) for the pick, the kernel tests and
# compute-sanitizer memcheck / racecheck / synccheck on its step (the producer now also waits on full barriers).
# `bash call-stages-in-flight.sh [SECONDS]` (default 570).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-570}
left() { echo $(( limit - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
timeout -k 5 60 build/fence_probe > $res/fence-probe.md 2>&1; echo "fence probe rc=$? ($(( $(date +%s) - start )) s)"
cat $res/fence-probe.md
run() {  # NAME BATCH LIMIT VARIANT...
  local name=$1 b=$2 lim=$3; shift 3
  local extra=(); for v in "$@"; do extra+=(--variant "$v"); done
  timeout -k 5 $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds 8 --iters 30 --control --variant base=variants/base.so "${extra[@]}" --out $res/$name > $res/$name.log 2>&1
  echo "$name rc=$? ($(( $(date +%s) - start )) s)"; cat $res/$name/table.md 2>/dev/null || tail -5 $res/$name.log
}
vs=(sif1=variants/sif1.so sif2=variants/sif2.so sif3=variants/sif3.so)
run b1 1 95 "${vs[@]}"
run b2 2 70 "${vs[@]}"
run b8 8 70 "${vs[@]}"
# the pick (benchmarks/ab/pick.py): batch 1 at least 1% faster than base and faster than the control's fastest
# round, batch 8 no more than 0.5% slower; the fastest at batch 1
pick=$(python3 -m benchmarks.ab.pick $res/b1 $res/b8 sif1 sif2 sif3)
echo "picked: ${pick:-none}"
for v in base ${pick:-sif2}; do  # traces of base and of the pick (sif2 when none is picked: the mechanism's check)
  cp variants/$v.so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
  timeout -k 5 40 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,8 --iters 10 \
    --save-traces --out $res/profile-$v > $res/profile-$v.log 2>&1
  echo "profile $v rc=$? ($(( $(date +%s) - start )) s)"; grep -A4 "^| batch | context" $res/profile-$v/report.md | head -4
  grep -A8 "^signal tails" $res/profile-$v/report.md | grep "^|" | cut -c1-80  # the fence's time (PERF_LOG #133)
done
if [ -n "$pick" ]; then
  cp variants/$pick.so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
  timeout -k 5 $(( $(left) - 130 )) python3 -m pytest -q -rA -p no:cacheprovider --durations=5 tests/gpu/test_each_opcode.py \
    tests/gpu/test_megakernel_step.py > $res/kernel-tests-$pick.txt 2>&1
  echo "kernel tests ($pick) rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/kernel-tests-$pick.txt
  grep -E "^FAILED" $res/kernel-tests-$pick.txt | head -8
  w=$(ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl); d=/tmp/cs-13.5.25; rm -rf $d; python3 -m zipfile -e $w $d
  chmod -R u+x $d/nvidia/cu13; cs=$d/nvidia/cu13/bin/compute-sanitizer
  COMPUTE_SANITIZER=$cs timeout -k 5 $(( $(left) - 10 )) python3 -m pytest -v -rA -p no:cacheprovider --durations=4 \
    tests/gpu/test_sanitizer.py -k "not ragged and not local" > $res/sanitizer-$pick.txt 2>&1
  echo "sanitizer ($pick) rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer-$pick.txt
  grep -E "^(PASSED|FAILED|ERROR)" $res/sanitizer-$pick.txt
fi
cd $OUT && tar czf r.tgz r && rm -rf r

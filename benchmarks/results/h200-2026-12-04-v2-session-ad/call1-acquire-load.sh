#!/usr/bin/env bash
# As it ran in session AD's call 1 (the patches it names: acquire-load.patch is `git show 564cc9e:benchmarks/candidates/
# acquire-load.patch`, landed in a53d565; the other two are in this folder).
# Next session, kernel alone (no vLLM, no stash calls; carry variants/ with base.so, acq.so, acqrf.so, acqre.so,
# build/fence_probe and .sanitizer/), built on the CPU machine from main by
#   PYTHON=/path/to/python3.12 bash benchmarks/ab/build.sh variants HEAD base acq=benchmarks/candidates/acquire-load.patch \
#     acqrf=benchmarks/candidates/acquire-load-release-fence.patch acqre=benchmarks/candidates/acquire-reread.patch
#   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -o build/fence_probe \
#     benchmarks/candidates/fence-probe/fence_probe.cu
# PERF_LOG #139 / #140: (0) the fence probe with its hop set (one dependency hop between two SMs by protocol: main's
# fences, the acquire load, a data-flag store with no fence; ~10 s); (1) `benchmarks.ab.interleaved` at 8K, one process per batch (1, 2, 8): main against
# acq (dependency waits acquire with ld.acquire.gpu instead of a relaxed poll and a MEMBAR.ALL.GPU fence) and acqrf
# (acq, and the signaller's fence.release.gpu in place of fence.acq_rel.gpu: no L1 invalidation, PERF_LOG #141) and
# acqre (relaxed polls, then one acquire re-read of the counter: one L1 invalidation a wait, not one a poll, PERF_LOG
# #142) with an A/A control; (2) acq's traces at batch 1 and 8 (what should move: the checks that find their inputs done, 1-2 us
# on main, and the signal-to-run hops); (3) the kernel tests and compute-sanitizer (memcheck, racecheck,
# synccheck) on acq, on the plain and the capped case (~160 s). `bash call-acquire-load.sh [SECONDS]` (570).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-570}
left() { echo $(( limit - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
timeout -k 5 60 build/fence_probe > $res/fence-probe.md 2>&1; echo "fence probe rc=$? ($(( $(date +%s) - start )) s)"
sed -n '/^| protocol/,$p' $res/fence-probe.md
for bl in 1:55 2:55 8:65; do  # batch:seconds (batch 16 took 64 s with 4 variants in session AC: 64 does not fit here)
  b=${bl%%:*}; lim=${bl#*:}
  # at batch 1 and 2 also acq with the whole ring: with the acquire no longer waiting for the SM's copies, the
  # cap's gain (PERF_LOG #136) may shrink
  extra=(); [ $b -le 2 ] && extra=(--variant acq5=variants/acq.so@stages_in_flight=5)
  timeout -k 5 $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds 6 --iters 20 --control --variant base=variants/base.so --variant acq=variants/acq.so \
    --variant acqrf=variants/acqrf.so --variant acqre=variants/acqre.so "${extra[@]}" \
    --out $res/b$b > $res/b$b.log 2>&1
  echo "b$b rc=$? ($(( $(date +%s) - start )) s)"; cat $res/b$b/table.md 2>/dev/null || tail -3 $res/b$b.log
done
cp variants/acq.so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
timeout -k 5 40 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,8 --iters 10 \
  --save-traces --out $res/profile-acq > $res/profile-acq.log 2>&1
echo "profile acq rc=$? ($(( $(date +%s) - start )) s)"; grep -A4 "^| batch | context" $res/profile-acq/report.md | head -4
timeout -k 5 $(( $(left) - 165 )) python3 -m pytest -q -rA -p no:cacheprovider --durations=5 tests/gpu/test_each_opcode.py \
  tests/gpu/test_megakernel_step.py > $res/kernel-tests-acq.txt 2>&1
echo "kernel tests (acq) rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/kernel-tests-acq.txt
grep -E "^FAILED" $res/kernel-tests-acq.txt | head -8
cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
COMPUTE_SANITIZER=$cs timeout -k 5 $(( $(left) - 8 )) python3 -m pytest -v -rA -p no:cacheprovider --durations=4 \
  tests/gpu/test_sanitizer.py -k "4500-7-pad and not local" > $res/sanitizer-acq.txt 2>&1
echo "sanitizer (acq) rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer-acq.txt
grep -E "^(PASSED|FAILED|ERROR)" $res/sanitizer-acq.txt
mkdir -p /tmp/traces && mv $res/profile-acq/traces.pt /tmp/traces/ 2>/dev/null  # 4 MB: not for the repo
cd $OUT && tar czf r.tgz r && rm -rf r

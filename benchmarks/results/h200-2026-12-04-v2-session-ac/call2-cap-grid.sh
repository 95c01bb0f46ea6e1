#!/usr/bin/env bash
# Session AC, call 2 (kernel alone; carry variants/cap.so, main's kernel with the runtime cap, and .sanitizer/):
# (1) StepShape.stages_in_flight at 8K, one `benchmarks.ab.interleaved` process per batch, the default (layout.
# stages_in_flight_for: 2 at batch 1, 3 at 2, the whole ring of 5 from 3) against the other caps on the same
# extension, with an A/A control; (2) the kernel tests (with the new bit-equal test of every cap) and (3)
# compute-sanitizer on the capped case and the plain one. `bash call2-cap-grid.sh [SECONDS]` (default 570).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-570}
left() { echo $(( limit - ($(date +%s) - start) )); }
so=variants/cap.so
cp $so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
grid() {  # BATCH SECONDS CAP...: the default against each cap
  local b=$1 lim=$2; shift 2
  local extra=(); for c in "$@"; do extra+=(--variant "c$c=$so@stages_in_flight=$c"); done
  timeout -k 5 $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds 8 --iters 30 --control --variant default=$so "${extra[@]}" --out $res/b$b > $res/b$b.log 2>&1
  echo "b$b rc=$? ($(( $(date +%s) - start )) s)"; cat $res/b$b/table.md 2>/dev/null || tail -5 $res/b$b.log
}
grid 1 50 3 4 5
grid 2 50 2 4 5
grid 3 50 2 3 4
grid 4 55 2 3 4
grid 8 55 3 4
grid 16 60 3 4
timeout -k 5 $(( $(left) - 110 )) python3 -m pytest -q -rA -p no:cacheprovider --durations=5 tests/gpu/test_each_opcode.py \
  tests/gpu/test_megakernel_step.py > $res/kernel-tests.txt 2>&1
echo "kernel tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/kernel-tests.txt
grep -E "^FAILED" $res/kernel-tests.txt | head -8
grep -A3 "stages in flight" $res/kernel-tests.txt | grep "bit-equal" | head -8
w=$(ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl); d=/tmp/cs-13.5.25; rm -rf $d; python3 -m zipfile -e $w $d
chmod -R u+x $d/nvidia/cu13; cs=$d/nvidia/cu13/bin/compute-sanitizer
COMPUTE_SANITIZER=$cs timeout -k 5 $(( $(left) - 8 )) python3 -m pytest -v -rA -p no:cacheprovider --durations=4 \
  tests/gpu/test_sanitizer.py -k "stages" > $res/sanitizer.txt 2>&1
echo "sanitizer rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer.txt
grep -E "^(PASSED|FAILED|ERROR)" $res/sanitizer.txt
cd $OUT && tar czf r.tgz r && rm -rf r

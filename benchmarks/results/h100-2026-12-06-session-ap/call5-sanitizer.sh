#!/usr/bin/env bash
# Session AP, call 5 (an H100; carry the extension, main at c82ba63's csrc/, and .sanitizer/): compute-sanitizer's
# three tools on the posted-routing case (batch 1's default routing hand-over; its synccheck had not run) and on the
# 2-stages-in-flight case, both with the look-ahead lane and its fix. Results in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $res/gpu.txt
cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
COMPUTE_SANITIZER=$cs timeout -k 5 ${1:-170} python3 -m pytest -v -rA -p no:cacheprovider --durations=6 \
  tests/gpu/test_sanitizer.py -k "posted-routing or 2-stages-in-flight" > $res/sanitizer.txt 2>&1
echo "sanitizer rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer.txt; grep -E "^(PASSED|FAILED|ERROR)" $res/sanitizer.txt
cd $OUT && tar czf r.tgz r && rm -rf r

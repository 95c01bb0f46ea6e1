#!/usr/bin/env bash
# Call 5 (session AI, H100): jw's kernel tests (not the flagged-residual ones) and its sanitizer cases (the three tools
# on the default 4500-7-pad case), carry variants/ and .sanitizer/. The kernel tests ran out of their 130 s.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; cp variants/jw.so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so; mkdir -p $OUT/r; s=$(date +%s)
timeout -k 5 130 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_each_opcode.py tests/gpu/test_megakernel_step.py \
  -k "not flagged_residual" > $OUT/r/jw-kernel-tests.txt 2>&1
echo "jw kernel-tests rc=$? ($(( $(date +%s) - s )) s)"; tail -1 $OUT/r/jw-kernel-tests.txt
cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
COMPUTE_SANITIZER=$cs timeout -k 5 $(( 370 - ($(date +%s) - s) )) python3 -m pytest -v -rA -p no:cacheprovider \
  tests/gpu/test_sanitizer.py -k "4500-7-pad] and not flagged" > $OUT/r/jw-sanitizer.txt 2>&1
echo "jw sanitizer rc=$? ($(( $(date +%s) - s )) s)"; grep -E "^(PASSED|FAILED|ERROR)" $OUT/r/jw-sanitizer.txt
cd $OUT && tar czf r.tgz r && rm -rf r

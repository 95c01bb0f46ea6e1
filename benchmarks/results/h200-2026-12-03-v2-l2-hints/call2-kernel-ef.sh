#!/usr/bin/env bash
# Session S, device call 2 (the warm machine; carry vllm_megakernel/_C*.so = variants/ef.so, main +
# l2-read-once-evict-first.patch, then in benchmarks/candidates/, now in this folder): the kernel tests on ef before it lands.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s)
MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 200 python3 -m pytest -q -rA -p no:cacheprovider \
  tests/gpu/test_each_opcode.py tests/gpu/test_megakernel_step.py > $res/kernel-tests-ef.txt 2>&1
echo "kernel tests (ef) rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/kernel-tests-ef.txt; grep -E "^FAILED" $res/kernel-tests-ef.txt | head -6
cd $OUT && tar czf r.tgz r && rm -rf r

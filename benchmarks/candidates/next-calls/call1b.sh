#!/usr/bin/env bash
# Next session, device call 1b (same machine as call 1; the same carry, variants/ also with cc.so): the kernel tests
# of the variants in the first argument (comma-separated, e.g. f0,cc), then the A/B of the names after it at
# batch 1, 8, 64 (kernel alone, one process environment) in the time left; e.g.
#   bash call1b.sh f0,cc base f0 cc base
# (if the A/B runs out of time, each finished run's report is in ab/<name>-<i>/; run the rest in another call)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
tests=${1:?variants to test}; shift
[ -d /tmp/nmc-5l ] || python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
for v in ${tests//,/ }; do
  cp variants/$v.so $so
  MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 110 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
    tests/gpu/test_each_opcode.py > $res/tests-$v.txt 2>&1; echo "$v tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-$v.txt
done
cp /tmp/main.so $so
timeout $(( 585 - ($(date +%s) - start) )) bash benchmarks/ab/run.sh variants $res/ab 1,8,64 "$@" > $res/ab.log 2>&1
echo "ab rc=$? ($(( $(date +%s) - start )) s)"; tail -8 $res/ab.log
cd $OUT && tar czf r.tgz r && rm -rf r

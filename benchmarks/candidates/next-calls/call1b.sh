#!/usr/bin/env bash
# Next session, device call 1b (same machine as call 1; the same carry): the kernel tests of the fence variant that
# racecheck passed (first argument, e.g. f0), then the A/B of the variants named after it at batch 1, 8, 64
# (kernel alone, one process environment), e.g.   bash call1b.sh f0 base f0 base
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
v=${1:?variant}; shift
[ -d /tmp/nmc-5l ] || python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so; cp variants/$v.so $so
MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 110 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
  tests/gpu/test_each_opcode.py > $res/tests-$v.txt 2>&1; echo "$v tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-$v.txt
cp /tmp/main.so $so
timeout $(( 585 - ($(date +%s) - start) )) bash benchmarks/ab/run.sh variants $res/ab 1,8,64 "$@" > $res/ab.log 2>&1
echo "ab rc=$? ($(( $(date +%s) - start )) s)"; tail -8 $res/ab.log
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
R=$PWD
res=$OUT/r; mkdir -p $res
prof() {  # NAME DIR [extra]
  (cd $2 && PYTHONPATH=$PWD python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,2,4,8,16 \
     --iters 20 --schedules default --out $res/$1 ${3:-} > $res/$1.log 2>&1; echo "$1 rc=$?")
}
prof base-1 base --save-traces
prof skipfix-2 $R --save-traces
prof base-3 base
prof skipfix-4 $R
python3 -m benchmarks.ab.table $res base-1 skipfix-2 base-3 skipfix-4 | tee $res/table.md
PYTHONPATH=$R python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
PYTHONPATH=$R timeout 200 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py > $res/tests-skipfix.txt 2>&1; echo "skipfix tests rc=$?"; tail -2 $res/tests-skipfix.txt
bash .offline-bundle/install.sh --stash .offline-bundle/p3 | tail -3
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session G, device call 4 (main's extension, o_within_down=0.7 the default from batch 16): the kernel tests
# (batch 17 and 64 take the new default), memcheck and synccheck on one step, the default against
# o_within_down=0 at batch 16, and a few tile / split / norm choices at batch 8 and 16 for the next session.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
timeout 120 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
  > $res/tests.txt 2>&1; echo "tests rc=$?"; tail -1 $res/tests.txt
timeout 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_sanitizer.py -k "memcheck or synccheck" \
  > $res/sanitizer.txt 2>&1; echo "sanitizer rc=$?"; tail -1 $res/sanitizer.txt
timeout 100 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 16 --iters 20 --out $res/b16 \
  --schedules "default;o_within_down=0;attn_splits=8;norm=wave;attn_splits=8,norm=wave" > $res/b16.log 2>&1; echo "b16 rc=$?"
timeout 100 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 8 --iters 20 --out $res/b8 \
  --schedules "default;moe_up_cols=64;moe_down_rows=64;combine_heads=8;combine_heads=2" > $res/b8.log 2>&1; echo "b8 rc=$?"
grep -h "per step" $res/*.log
cd $OUT && tar czf r.tgz r && rm -rf r

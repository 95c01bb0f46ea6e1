#!/usr/bin/env bash
# device call 1 (session F): A/B of skip (this checkout) and abort (base/ + variants/abort.so) against base/
set -u
export PYTHONUNBUFFERED=1
R=$PWD
res=$OUT/r; mkdir -p $res
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $res/gpu.txt
prof() {  # NAME DIR
  (cd $2 && PYTHONPATH=$PWD python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,2,4,8,16 \
     --iters 20 --schedules default --out $res/$1 ${3:-} > $res/$1.log 2>&1; echo "$1 rc=$?")
}
cp variants/abort.so /tmp/abort.so
prof base-1 base
prof skip-2 $R --save-traces
cp base/vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so /tmp/base.so
cp /tmp/abort.so base/vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
prof abort-3 base
cp /tmp/base.so base/vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
prof base-4 base
prof skip-5 $R
python3 -m benchmarks.ab.table $res base-1 skip-2 abort-3 base-4 skip-5 | tee $res/table.md
PYTHONPATH=$R python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
PYTHONPATH=$R timeout 200 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py > $res/tests-skip.txt 2>&1; echo "skip tests rc=$?"; tail -2 $res/tests-skip.txt
cp /tmp/abort.so base/vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
(cd base && PYTHONPATH=$PWD timeout 200 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py > $res/tests-abort.txt 2>&1; echo "abort tests rc=$?"; tail -2 $res/tests-abort.txt)
PYTHONPATH=$R timeout 150 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_sanitizer.py -k "memcheck or synccheck" > $res/sanitizer-skip.txt 2>&1; echo "skip sanitizer rc=$?"; tail -2 $res/sanitizer-skip.txt
(cd base && PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_sanitizer.py -k "memcheck or synccheck" > $res/sanitizer-abort.txt 2>&1; echo "abort sanitizer rc=$?"; tail -2 $res/sanitizer-abort.txt)
cd $OUT && tar czf r.tgz r && rm -rf r

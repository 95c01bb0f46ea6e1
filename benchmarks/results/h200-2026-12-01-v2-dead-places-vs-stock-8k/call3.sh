#!/usr/bin/env bash
# Session H, device call 3 (the machine of call 2, the bundle still installed; variants/ carried: base.so =
# the kernel before this session's landing, new.so = main's): stock and megakernel inside vLLM at batch 16,
# 8K, then the kernel alone, old against new, at batch 1 and 2 (call 1 left batch 1 unsettled).
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 380 python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy \
  --batch-sizes 16 --contexts 8192 --new-tokens 256 --cache-prompts --out $res/sweep16 > $res/sweep16.log 2>&1
echo "sweep16 rc=$?"; cat $res/sweep16/table.md
timeout 150 bash benchmarks/ab/run.sh variants $res/ab 1,2 base new base new base new > $res/ab.log 2>&1
echo "ab rc=$?"; tail -10 $res/ab.log
cd $OUT && tar czf r.tgz r && rm -rf r

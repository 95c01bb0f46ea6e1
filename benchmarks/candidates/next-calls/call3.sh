#!/usr/bin/env bash
# Session K, device call 3 (after four `install.sh --stash` calls; main's extension and variants/cw.so
# carried, with install.sh, env.sh, bundle.sha256): inside vLLM at 8K, batch 1, 2, 4 (batch 1's new tile
# sizes; 2 and 4 never measured on the warpgroup-registers kernel) and batch 8 with uniform routing (the
# row-keyed draw); then the attention wave against FA3 on main and on cw.
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 330 python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy \
  --batch-sizes 1,2,4 --contexts 8192 --new-tokens 256 --cache-prompts --out $res/sweep > $res/sweep.log 2>&1
echo "sweep rc=$?"; cat $res/sweep/table.md
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
for v in main cw; do
  [ $v = cw ] && cp variants/cw.so $so
  timeout 60 python -m benchmarks.attention_bench --model configs/north-mini-code --batch-sizes 8,64 \
    --contexts 1024,8192 --iters 10 --reps 5 --out $res/attention-$v > $res/attention-$v.log 2>&1
  echo "attention $v rc=$?"; cat $res/attention-$v/table.md
done
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

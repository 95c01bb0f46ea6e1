#!/usr/bin/env bash
# Next session, device call 2 (carry vllm_megakernel/_C*.so = main, variants/ with base.so (= main), base2.so (a
# byte copy of base.so), prefad.so (0e4b823: the combine by column, before the per-lane releases) and sw.so):
# 1. benchmarks.ab.interleaved (every extension in one process, the same steps, rotated rounds; its first GPU run):
#    an A/A pair (base, base2: the same code loaded twice, so the paired change and its range are the method's
#    own noise, code placement included), prefad (what the per-lane releases of d818944 cost at batch 1 and 8,
#    which session O could not tell in separate processes), sw, and main with 32-row QKV tiles (q32: a schedule
#    with a step of its own), at batch 1, 8, 64.
# 2. attention split counts at batch 8 (16, 15 against 17) and 1 (64 against 128), each batch in a process of its own.
# 3. the two traces planned since session N: batch 1 with 32-row QKV tiles (28 SMs run two QKV tasks in a row:
#    is the QKV task's 3 us inputs phase a cold start, code or data?) and batch 64 with qkv_batch_split=4
#    (PERF_LOG #77's miss) with 48-column up/gate tasks timed beside it (#86).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s); limit=570
timeout 240 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes 1,8,64 --rounds 8 \
  --iters 30 --variant base=variants/base.so --variant base2=variants/base2.so --variant prefad=variants/prefad.so \
  --variant sw=variants/sw.so --variant q32=variants/base.so@qkv_rows=32 --out $res/interleaved > $res/interleaved.log 2>&1
echo "interleaved rc=$? ($(( $(date +%s) - start )) s)"; tail -16 $res/interleaved.log
# attention split counts where the defaults were last decided on older kernels, paired in one process each:
# batch 8 at 16 / 15 splits against the default 17 (136 partial tasks on 132 SMs; PERF_LOG #59 predicted 16 -1 to
# -2%), batch 1 at 64 against the default 128 splits
for spec in "8 s16=variants/base.so@attn_splits=16 s15=variants/base.so@attn_splits=15" \
            "1 s64=variants/base.so@attn_splits=64"; do
  set -- $spec; batch=$1; shift; extra=(); for v in "$@"; do extra+=(--variant "$v"); done
  timeout 120 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $batch --rounds 8 \
    --iters 30 --variant base=variants/base.so "${extra[@]}" --out $res/splits-$batch > $res/splits-$batch.log 2>&1
  echo "splits batch $batch rc=$? ($(( $(date +%s) - start )) s)"; tail -6 $res/splits-$batch.log
done
for b in "1 qkv_rows=32;default" "64 qkv_batch_split=4;moe_up_cols=48;default"; do
  left=$(( limit - ($(date +%s) - start) )); [ $left -lt 60 ] && { echo "trace $b: no time left"; continue; }
  batch=${b%% *} sched=${b#* }
  timeout $(( left < 180 ? left : 180 )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
    --batch-sizes $batch --iters 5 --schedules "$sched" --out $res/trace-$batch > $res/trace-$batch.log 2>&1
  echo "trace batch $batch ($sched) rc=$? ($(( $(date +%s) - start )) s)"; grep -h "us per step" $res/trace-$batch.log
done
cd $OUT && tar czf r.tgz r && rm -rf r

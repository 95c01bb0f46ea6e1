#!/usr/bin/env bash
# Written for after call-stages-in-flight.sh's pick; since session AC main itself has the cap (StepShape.stages_in_flight,
# 2 at batch 1, 3 at 2), so PICK is `base` (carry variants/base.so, main) or a later kernel (e.g. acq, once landed):
# schedule choices measured before the cap that were within the spread or lost by their per-task costs, timed again
# on that kernel, against its own default schedule, one `benchmarks.ab.interleaved`
# process per batch (1, 2, 4; batch 4 is issue #12's concurrency-4 TPOT). If the cap takes ~1 us off each task's
# signal and inputs (PERF_LOG #134), smaller up/gate tiles (moe_up_cols=24: #108 measured +0.6%, its shorter tail
# paid for by one more task an SM) and the live splits on SMs without QKV (split_order=live_first with 48 live tasks:
# #112 measured -0.55%) should move to -1 to -3% at batch 1; o_within_down=0.7 (batch 16's default, within the spread
# at 1-8: #35-#36, layout.o_within_down_for) is the control case: it changes no per-task cost, so it should stay within +-1%.
# `bash call-after-in-flight.sh PICK [SECONDS]` (default 300).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
pick=${1:?the picked variant, e.g. sif2}; limit=${2:-300}
res=$OUT/r; mkdir -p $res; start=$(date +%s)
so=variants/$pick.so
for bl in 1:100 2:90 4:100; do  # batch:seconds (5 rows a batch took ~95 s at batch 1 in session Z's call 1)
  b=${bl%%:*}; lim=${bl#*:}; left=$(( limit - ($(date +%s) - start) - 5 )); [ $lim -gt $left ] && lim=$left
  [ $lim -lt 30 ] && { echo "b$b: no time left"; continue; }
  timeout -k 5 $lim python3 -m benchmarks.ab.interleaved \
    --model configs/north-mini-code --batch-sizes $b --rounds 8 --iters 30 --control --variant $pick=$so \
    --variant up24=$so@moe_up_cols=24 --variant lf48=$so@split_order=live_first,attn_live_tasks=48 \
    --variant owd=$so@o_within_down=0.7 --out $res/b$b > $res/b$b.log 2>&1
  echo "b$b rc=$? ($(( $(date +%s) - start )) s)"; cat $res/b$b/table.md 2>/dev/null || tail -5 $res/b$b.log
done
cd $OUT && tar czf r.tgz r && rm -rf r

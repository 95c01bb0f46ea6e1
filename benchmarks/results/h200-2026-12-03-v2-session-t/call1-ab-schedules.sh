#!/usr/bin/env bash
# A later call (kernel alone, no vLLM; carry vllm_megakernel/_C*.so built from main's csrc/): schedule choices
# decided on older kernels, re-timed on the kernel with session S's L2 evict-first copies, where every phase that
# reads another SM's output got shorter (PERF_LOG #101), in one `benchmarks.ab.interleaved` process per batch:
# at batch 1 / 2 / 4 the default against order=combine_before_experts (PERF_LOG #19: -3.0 / -0.8 / +1.3% then;
# in session S's batch-1 trace the combine tasks start 2.9 us after the last attention partial, behind up/gate
# tiles, and the O projection waits on them), o_within_down=0.5 (the O places among the down places) and, at batch
# 1, attn_splits=64 (PERF_LOG #10: 128 splits chosen when a combine task took 17 us) and qkv_rows=40,router_rows=32
# (batch 2-8's tiles: layout.gemm_tiles' chain_first, PERF_LOG #50-#51, decided when the router's inputs took 3.9
# us); and at every batch cbeowd, both cbe and owd (session T: the combine right after attention, then the O places
# among the down places, where the combine they wait on is done). `bash call-ab-schedules.sh`
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s)
so=$(ls vllm_megakernel/_C*.so)
for b in 1 2 4; do
  extra=""; [ $b = 1 ] && extra="--variant s64=$so@attn_splits=64 --variant nochain=$so@qkv_rows=40,router_rows=32"
  timeout 150 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b --rounds 8 \
    --iters 30 --variant base=$so --variant cbe=$so@order=combine_before_experts --variant owd=$so@o_within_down=0.5 \
    --variant cbeowd=$so@order=combine_before_experts,o_within_down=0.5 \
    $extra --out $res/ab-b$b > $res/ab-b$b.log 2>&1
  echo "ab batch $b rc=$? ($(( $(date +%s) - start )) s)"; cat $res/ab-b$b/table.md 2>/dev/null || tail -5 $res/ab-b$b.log
done
cd $OUT && tar czf r.tgz r && rm -rf r

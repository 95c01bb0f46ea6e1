#!/usr/bin/env bash
# A later call (kernel alone, no vLLM; PERF_LOG #114). Before it, on the CPU machine:
#   PYTHON=/path/to/python3.12 bash benchmarks/ab/build.sh variants base \
#     kvpf=benchmarks/candidates/qkv-lookahead-kv-l2-prefetch.patch \
#     kvopf=benchmarks/candidates/lookahead-kv-and-o-l2-prefetch.patch
# and carry variants/ (base.so = main, kvpf.so, kvopf.so). At each QKV_ROPE place whose next place on the SM is an
# ATTN_PARTIAL, the producer asks L2 for that partial's history tiles before it issues the QKV's stages
# (`qkv-lookahead-kv-l2-prefetch.patch`); kvpflr adds local routing (PERF_LOG #111: the expert chain shortened,
# the attention chain lengthened; here the attention chain gets shorter too); kvopf also, at a down place whose
# next place is an O_PROJ, asks L2 for that O task's weight rows. One ab.interleaved process per batch.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s)
run() {  # NAME BATCH LIMIT VARIANT...
  local name=$1 b=$2 lim=$3; shift 3
  local extra=(); for v in "$@"; do extra+=(--variant "$v"); done
  timeout $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds 8 --iters 30 --variant base=variants/base.so "${extra[@]}" --out $res/$name > $res/$name.log 2>&1
  echo "$name rc=$? ($(( $(date +%s) - start )) s)"; cat $res/$name/table.md 2>/dev/null || tail -5 $res/$name.log
}
run b1 1 90 kvpf=variants/kvpf.so kvopf=variants/kvopf.so kvpflr=variants/kvpf.so@local_routing=1 \
  kvopflr=variants/kvopf.so@local_routing=1
run b2 2 60 kvpf=variants/kvpf.so kvopf=variants/kvopf.so
run b8 8 60 kvpf=variants/kvpf.so kvopf=variants/kvopf.so
cd $OUT && tar czf r.tgz r && rm -rf r

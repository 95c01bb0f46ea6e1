#!/usr/bin/env bash
# Call 3 (session AI, H100): jw, pr and op against main again, in another process than call 2's, at batch 1, 2, 4, 8
# (carry variants/ built at 01edbaa as call1-2-posted-routing.sh's header says). Tables in the log of each batch.
export PYTHONPATH=$PWD; cp variants/base.so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so; mkdir -p $OUT/r
for b in 1 2 4 8; do
  timeout -k 5 90 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b --rounds 6 \
    --iters 20 --control --variant base=variants/base.so --variant jw=variants/jw.so \
    --variant pr=variants/base.so@posted_routing=1 --variant op=variants/base.so@o_prefetch=1 \
    --out $OUT/r/rerun-b$b > $OUT/r/rerun-b$b.log 2>&1
  echo "b$b rc=$?"; cat $OUT/r/rerun-b$b/table.md 2>/dev/null || tail -3 $OUT/r/rerun-b$b.log
done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $OUT/r/gpu.txt

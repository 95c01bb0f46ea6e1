#!/usr/bin/env bash
# Call 4 (session AI, H100): batch 8 and 2 profiles of the default and o_prefetch, every task's record saved (traces.pt)
export PYTHONPATH=$PWD; cp variants/base.so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so; mkdir -p $OUT/r
timeout -k 5 300 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 8,2 --iters 10 \
  --schedules "default;o_prefetch=1" --save-traces --out $OUT/r/profile-b8-b2 > $OUT/r/profile-b8-b2.log 2>&1
echo "profile rc=$?"; grep -A6 "^| batch | context" $OUT/r/profile-b8-b2/report.md | head -8
grep -E "^period " $OUT/r/profile-b8-b2/report.md; cd $OUT && tar czf r.tgz r && rm -rf r

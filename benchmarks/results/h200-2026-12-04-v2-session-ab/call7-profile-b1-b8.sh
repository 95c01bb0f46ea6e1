#!/usr/bin/env bash
# Session AB, device call 7, as it ran (one command line; carry vllm_megakernel/_C*.so built from main): the kernel
# alone at batch 1 and 8, 8K history, main's default schedule, for issue #10's per-wave figures. The traces
# (traces.pt, 4 MB) were not committed: report.md holds the tables read from them.
mkdir -p $OUT/p; timeout 170 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,8 \
  --iters 10 --save-traces --out $OUT/p/profile-b1-b8 > $OUT/p/profile.log 2>&1; echo rc=$?; tail -30 $OUT/p/profile.log
cd $OUT && tar czf p.tgz p && rm -rf p

#!/usr/bin/env bash
# Next session, the kernel alone (no vLLM, no stash calls; carry vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
# built from main and .sanitizer/ with the nvidia-cuda-sanitizer-api 13.5.25 wheel). Session AS turned posted routing
# and posted scores on at batch 3 and 4 too (PERF_LOG #201, from two H100 processes a batch: -0.65 / -0.37% at 3,
# -0.51 / -0.36% at 4); nothing has run on that default yet. Session AS ran this script's previous form on an H100
# (batch 2's checks: all passed). Either GPU.
# (0) compute-sanitizer's three tools on `4500-7-pad` (batch 3's default, now posted routing and scores) and on
#     `4500-7-pad-barrier-routing` (the top-k's barrier on the same batch, batch 5 and up's form);
# (1) every kernel test (test_megakernel_step.py, test_each_opcode.py; 92 ran in ~125 s on an H100), on the new default;
# (2) `benchmarks.ab.interleaved --copies 3` at batch 3 and 4, 8 rounds, an A/A control: main against nopr
#     (`posted_routing=0`, which takes posted scores off too);
# (3) kernel_profile at batch 1, 4, 8 and 64 (64 at 8K needs the H200's memory: an H100 leaves it out and says why);
# (4) if build/stage_pace_probe is carried (built as benchmarks/candidates/stage-pace-probe/stage_pace_probe.cu's header
#     says): the consumers' pace on resident stages, 8 warps against 4 (PERF_LOG #203-#204; ~5 s).
# Predictions (#201): nopr +0.3 to +0.8% at batch 3 and 4 on either GPU. #204: the probe's 4 / 8 ratio.
# `bash call-h200-kernel.sh [SECONDS]` (default 560; later stages are skipped on time). Results in $OUT/r.tgz.
set -u
source benchmarks/candidates/next-calls/call-lib.sh ${1:-560}
if [ -x build/stage_pace_probe ]; then  # first: seconds, and it decides whether the two-group form is worth writing
  timeout -k 5 60 build/stage_pace_probe > $res/stage-pace-probe.md 2>&1; stamp stage-pace-probe $?
  cat $res/stage-pace-probe.md
else
  echo "stage-pace-probe: build/stage_pace_probe not carried, skipped"
fi
sanitize 4500-7-pad 120
sanitize 4500-7-pad-barrier-routing 120
kernel_tests 160
ab b3 3 60 --copies 3 nopr=posted_routing=0
ab b4 4 60 --copies 3 nopr=posted_routing=0
profile 1,4,8,64
pack_results

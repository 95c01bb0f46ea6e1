#!/usr/bin/env bash
# Writes one probe patch per opcode (signal-delay-<OP>.patch, next to this script): the signaller holds back the
# signal of every task of that opcode for 3 us after the task's consumers finished (the task's own SM moves on;
# the tasks that wait on the signal see it later, and so do that SM's next signals, queued behind it in the
# signaller: a wave whose tasks run shorter than 3 us on one SM is delayed by more than 3 us). Not a kernel change to land: a sensitivity probe. How much
# a 3 us later signal of one wave moves the step says whether that wave's completion sits on the layer's critical
# path (the whole 3 us a layer), has slack (nothing), or in between -- what the timing model, which has no
# bandwidth, could not say at batch 1 (PERF_LOG #83, #89, #90). Run from the checkout root.
set -euo pipefail
here=benchmarks/candidates/signal-delay
for op in ROUTER ROUTER_TOPK QKV_ROPE ATTN_PARTIAL ATTN_COMBINE MOE_UPGATE MOE_DOWN O_PROJ MOE_COMBINE; do
  cp csrc/megakernel.cu /tmp/megakernel.cu.orig
  python3 - "$op" <<'PY'
import sys
op = sys.argv[1]
p = "csrc/megakernel.cu"; s = open(p).read()
old = "    arrive_barrier(barriers, d[abi::F_SIGNAL_BARRIER]);\n    // The top-k also signals"
new = (f"    if (d[abi::F_OPCODE] == abi::OP_{op}) {{  // probe: this wave's signals 3 us late\n"
       "      const unsigned long long until = global_timer_ns() + 3000;\n"
       "      while (global_timer_ns() < until) {\n      }\n    }\n" + old)
assert s.count(old) == 1
open(p, "w").write(s.replace(old, new))
PY
  git diff csrc/megakernel.cu > $here/signal-delay-$op.patch
  cp /tmp/megakernel.cu.orig csrc/megakernel.cu
done
git diff --quiet csrc/megakernel.cu && ls $here

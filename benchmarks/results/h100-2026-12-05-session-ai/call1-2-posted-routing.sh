#!/usr/bin/env bash
# Next session, kernel alone (no vLLM, no stash calls; carry variants/ with base.so, jw.so, frb.so and l1p.so, built on
# the CPU machine from main by
#   PYTHON=/path/to/python3.12 bash benchmarks/ab/build.sh variants HEAD base \
#     jw=benchmarks/candidates/joint-input-waits.patch frb=benchmarks/candidates/flagged-poll-pause.patch \
#     l1p=benchmarks/candidates/residual-loads-past-l1.patch
# and .sanitizer/). PERF_LOG #154: flagged residual words (fr, StepShape.flagged_residual: the layer boundary's
# QKV and router tasks poll the previous layer's x, o and mlp as self-flagged words from their start and take their
# waits before their first write) and #155, frb (fr with a 400 ns pause before a poll copies again), then #151 and #152: posted routing (pr) and local routing (lr) again, now that the
# MoE combine checks the top-k's barrier before the down wave's (session AE's call 4 ran pr with the other order:
# +0.19% at batch 1, the combine ending 0.9 us further behind the down wave), and jw (the consumer leader polls a
# task's two input barriers together).
# Two parts, one call each, on the same warm machine (each ~300 s; together past one call's 600 s), `tests` first:
# a failure there comes before any speed figure.
# `speed`: (1) `benchmarks.ab.interleaved` at batch 1, one process with an A/A control: main against fr, frb, pr, lr
# and jw (the A/B checks each variant's output against the reference); (2) the same at batch 2 (fr, frb, pr) and 4
# (fr, frb); (3) kernel_profile at batch 1 of the default, fr, pr and qkv_rows=32 (160 QKV tasks: 28 SMs run two in a
# row, so the profile's previous-opcode table has QKV's inputs phase after a QKV task, the instruction cache warm,
# beside after another opcode: PERF_LOG #153), with every task's record saved (traces.pt) for reading offline, and
# each row's layer cut at its routing chain (trace.layer_phases: where fr moves the period's time) and walked back
# along what it waited on (trace.critical_path: which hops, tails and queues the period is made of).
# `tests`: every kernel test on main's build (the default path's kernel changed in session AF and again in AG: the
# block context, the per-task flagged check, the writers' branches, the top-k's registers, the paired stores; fr's
# tests are among them: the whole step bit-equal to the plain one, the words it left, aborts in its polls), then
# compute-sanitizer memcheck / racecheck / synccheck on the default case and fr's, in one process.
# pr at batch 8 (+0.30% in session AE) and jw's kernel tests (for landing jw, only if it wins) are left to a later call.
# Last in `speed`, if 70 s are left: the same qkv_rows=32 profile on l1p (PERF_LOG #159), whose folded norm loads
# past L1: the base kernel's second QKV task on an SM finds its rows in L1 (no acquire invalidated it between the two),
# so the first profile's "after a QKV task" mixes warm code with warm data.
# `bash call-posted-routing.sh speed|tests [SECONDS]` (default 330; later stages are skipped on time; `speed 420` runs all of it).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
part=${1:?speed or tests}
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${2:-330}
left() { echo $(( limit - ($(date +%s) - start) )); }
stamp() { echo "$1 rc=$2 ($(( $(date +%s) - start )) s)"; }
so=variants/base.so
cp $so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so  # the sanitizer and kernel_profile import the package's own
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
run() {  # NAME BATCH SECONDS VARIANT=SCHEDULE...: one process, main against jw and each schedule, A/A control
  local name=$1 b=$2 lim=$3; shift 3
  [ $(left) -lt $(( lim + 5 )) ] && { echo "$name: skipped, $(left) s left"; return; }
  local args=(--variant base=$so --variant jw=variants/jw.so)
  for v in "$@"; do  # NAME=SCHEDULE on main's build, or NAME=BUILD@SCHEDULE
    case "$v" in *@*) args+=(--variant "$v") ;; *) args+=(--variant "${v%%=*}=$so@${v#*=}") ;; esac
  done
  timeout -k 5 $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds 6 --iters 20 --control "${args[@]}" --out $res/$name > $res/$name.log 2>&1
  stamp $name $?; cat $res/$name/table.md 2>/dev/null || tail -3 $res/$name.log
}
if [ "$part" = speed ]; then
  # op: the O projection's rows prefetched into L2 while the producers wait on the routing (PERF_LOG #162); it took
  # local routing's place at batch 1 (lr: +3.35% in session AE's call 1, left for a later call)
  run b1 1 75 fr=flagged_residual=1 frb=variants/frb.so@flagged_residual=1 pr=posted_routing=1 op=o_prefetch=1
  run b2 2 55 fr=flagged_residual=1 frb=variants/frb.so@flagged_residual=1 pr=posted_routing=1 op=o_prefetch=1
  run b4 4 55 fr=flagged_residual=1 frb=variants/frb.so@flagged_residual=1 op=o_prefetch=1
  if [ $(left) -gt 80 ]; then
    lim=$(( $(left) - 8 )); [ $lim -gt 130 ] && lim=130  # session AE: four rows in 80 s; the rest for l1p's row
    timeout -k 5 $lim python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1 --iters 10 \
      --schedules "default;o_prefetch=1;flagged_residual=1;posted_routing=1;qkv_rows=32" --save-traces --out $res/profile > $res/profile.log 2>&1
    stamp profile $?; grep -A4 "^| batch | context" $res/profile/report.md | head -5
    grep -E "^\| (qkv|router|mlp_down|o_proj|moe_combine|router_topk|mlp_up) \| [0-9]" $res/profile/report.md
    grep -E "^\| qkv \| [0-9]+ \| [0-9-]" $res/profile/report.md  # qkv after its own opcode / after another
    grep -A2 "^| boundary |" $res/profile/report.md | grep -E "^\| [0-9]"  # each row's layer cut at its routing
    grep -E "^period |^\| [a-z_]+ \| (hop from|flagged from|queued)" $res/profile/report.md | head -40  # what it waited on
    grep -A2 "^| the path's waves" $res/profile/report.md | grep -vE "^\|---|^\| the path"
  fi
  # only beside main's own qkv_rows=32 row, and with the probe's build there (else it would profile base again)
  if [ $(left) -gt 70 ] && grep -q "schedule qkv_rows=32" $res/profile/report.md 2>/dev/null && [ -f variants/l1p.so ]; then
    # PERF_LOG #159: qkv_rows=32 again with the folded norm's loads past L1 (l1p), so
    # that a second QKV task on an SM reads its rows from L2 as the first did: what is left of "after a QKV task"
    # against "after another" is the code's warmth
    cp variants/l1p.so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
    timeout -k 5 $(( $(left) - 8 )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1 \
      --iters 10 --schedules "qkv_rows=32" --out $res/profile-l1p > $res/profile-l1p.log 2>&1
    stamp profile-l1p $?; grep -E "^\| (qkv|router) \| [0-9]+ \| [0-9-]" $res/profile-l1p/report.md
    cp $so vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
  fi
elif [ "$part" = tests ]; then
  timeout -k 5 125 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_each_opcode.py \
    tests/gpu/test_megakernel_step.py > $res/kernel-tests.txt 2>&1
  stamp kernel-tests $?; tail -1 $res/kernel-tests.txt; grep -E "^(FAILED|ERROR)" $res/kernel-tests.txt | head -8
  if [ $(left) -gt 60 ]; then  # session AE's one case ran past 75 s after two of its three tools
    cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
    COMPUTE_SANITIZER=$cs timeout -k 5 $(( $(left) - 10 )) python3 -m pytest -v -rA -p no:cacheprovider --durations=6 \
      tests/gpu/test_sanitizer.py -k "4500-7-pad] or flagged-residual" > $res/sanitizer.txt 2>&1
    stamp sanitizer $?; tail -1 $res/sanitizer.txt; grep -E "^(PASSED|FAILED|ERROR)" $res/sanitizer.txt
  fi
fi
cd $OUT && tar czf r.tgz r && rm -rf r

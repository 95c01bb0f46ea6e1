#!/usr/bin/env bash
# On a GPU host that has vLLM 0.24.0 importable (e.g. through shared/gpu-bundle's env.sh): build the
# extension in place (once per host) and run the GPU tests, whole or in stages that each fit a 10-minute
# device call. Logs go to $OUT when it is set (the device tool's output folder), else to ./out.
#
#   bash tests/gpu/run_on_gpu_host.sh [all|prepare|kernel|vllm|graphs|serve] [extra pytest args]
#
#   prepare only the build and the checkpoint: run it once before starting stages in parallel (on separate
#           GPUs through CUDA_VISIBLE_DEVICES), so they neither build nor write the checkpoint twice at once
#   kernel  extension, whole-step and per-opcode kernel tests; compute-sanitizer memcheck and racecheck
#           run alongside (separate processes, no vLLM engine, so they cannot upset vLLM's memory profiling)
#   vllm    switch-off equivalence and the step-by-step comparison with stock vLLM (eager)
#   graphs  256-token greedy A/B through both CUDA-graph modes; a stall inside a replayed graph is reported
#   serve   the OpenAI server
# All stages share one 5-layer checkpoint ($MEGAKERNEL_TEST_CHECKPOINT, default /tmp/nmc-5l).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-out}; mkdir -p "$out"
stage=${1:-all}; shift || true
export MEGAKERNEL_TEST_CHECKPOINT=${MEGAKERNEL_TEST_CHECKPOINT:-/tmp/nmc-5l}
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }
pt() {  # pt NAME pytest-args...: one pytest run, logged to $out/NAME.log, its summary line echoed
  local name=$1; shift
  python3 -m pytest -v -rA -s -p no:cacheprovider "$@" > "$out/$name.log" 2>&1
  local rc=$?
  stamp "$name: $(tail -1 "$out/$name.log")"
  return $rc
}

if ! python3 -c "import vllm_megakernel._C" 2>/dev/null; then
  python3 -m pip install --no-build-isolation --no-deps -e . > "$out/build.log" 2>&1 \
    || { tail -40 "$out/build.log"; exit 1; }
  stamp "extension built"
fi
python3 -c "from vllm_megakernel import _C; print(_C.build_info(), _C.query_device(0))"
# the conftest fixture's checkpoint, written once before stages run in parallel (make_checkpoint writes
# .complete last)
if [[ ! -f $MEGAKERNEL_TEST_CHECKPOINT/.complete ]]; then
  python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code "$MEGAKERNEL_TEST_CHECKPOINT" \
    --seed 1 --num-layers 5 || exit 1
  stamp "checkpoint written"
fi

rc=0
case $stage in
  prepare) ;;
  kernel)
    pt memcheck tests/gpu/test_sanitizer.py -k memcheck "$@" & m=$!
    pt racecheck tests/gpu/test_sanitizer.py -k racecheck "$@" & r=$!
    pt kernel tests/gpu/test_extension_on_gpu.py tests/gpu/test_benchmark_tools_on_gpu.py tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py "$@" || rc=1
    wait $m || rc=1; wait $r || rc=1 ;;
  vllm)
    pt equivalence tests/gpu/test_stock_equivalence.py "$@" || rc=1
    pt stepwise tests/gpu/test_vllm_megakernel_e2e.py -k each_decode_step "$@" || rc=1 ;;
  graphs)
    pt graphs tests/gpu/test_vllm_megakernel_e2e.py -k greedy_tokens "$@" || rc=1
    pt stall tests/gpu/test_stall_reporting_in_vllm.py "$@" || rc=1 ;;
  serve) pt serve tests/gpu/test_serve.py "$@" || rc=1 ;;
  all) pt all tests/gpu "$@" || rc=1 ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
[[ $stage == prepare ]] && exit 0
grep -h -E "^(PASSED|FAILED|ERROR|SKIPPED)|cosine|divergence|routed differently|RACECHECK SUMMARY|ERROR SUMMARY" \
  "$out"/*.log | tail -80
exit $rc

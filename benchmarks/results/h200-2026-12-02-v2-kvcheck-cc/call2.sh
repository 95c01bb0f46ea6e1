#!/usr/bin/env bash
# Next session, device call 2 (a fresh machine or after call 1; carry vllm_megakernel/_C*.so = main, variants/ with
# the kernels named as arguments, and .sanitizer/ with nvidia-cuda-sanitizer-api 13.5.25 = compute-sanitizer
# 2026.4.0): racecheck of each kernel named, in order (e.g. `bash call2.sh fa fl`), on a 2-layer step (one live
# row with a 300-token history, a padding row). Session N's runs of that step (~190 MB through the stage rings)
# did not finish in 240 s with every block instrumented. So, per kernel: the step on block 17 only (the block
# session N's records named) if this compute-sanitizer has --racecheck-filter-cluster-id (one cluster, or one
# block without clusters); then every block on the step's prefix through layer 0's dense up/gate wave
# (`sanitize_step.py --through mlp_up`: the QKV, attention and up/gate tasks, ~47 MB, where session N's records
# were); then every block on the whole 2-layer step in the time left.
# (Session O: the two traces planned here moved to a later call; first, cc's tests that call 1's limit cut.)
# Planned before: (kernel_profile traces a process's first schedule only; ~190 s): batch 1 with 32-row QKV tiles
# (160 QKV tasks, so 28 SMs run two in a row: the trace's "after its own opcode" row then says whether the QKV
# task's 3.2 us inputs phase is a cold start -- code or data -- or the folded norm's own work; PERF_LOG #83), and
# batch 64 with `qkv_batch_split=4` (PERF_LOG #77's miss: +0.4% against -2.5% predicted), with the 48-column
# up/gate tasks timed in the same process (PERF_LOG #86).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-2l --seed 1 --num-layers 2 > $res/ckpt.log 2>&1
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt5.log 2>&1
w=$(ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl); d=/tmp/cs-13.5.25; rm -rf $d; python3 -m zipfile -e $w $d
chmod -R u+x $d/nvidia/cu13; cs=$d/nvidia/cu13/bin/compute-sanitizer; $cs --version | tail -1 > $res/version.txt
$cs --help > $res/help.txt 2>&1; grep -A3 -i "racecheck" $res/help.txt | head -60 > $res/help-racecheck.txt
filter=(); grep -q -- "--racecheck-filter-cluster-id" $res/help.txt && filter=(--racecheck-filter-cluster-id 17)
echo "filter: ${filter[*]:-none}"
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
cp variants/cc.so $so  # cc's tests that call 1's limit cut: the traced launch and every opcode (ATTN_COMBINE's by-column path)
MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 170 python3 -m pytest -q -rA -p no:cacheprovider --durations=12 \
  "tests/gpu/test_megakernel_step.py::test_a_traced_launch_records_every_task_in_dependency_order" tests/gpu/test_each_opcode.py \
  > $res/tests-cc-rest.txt 2>&1; echo "cc rest tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-cc-rest.txt
grep -E "^FAILED|^E  +AssertionError" $res/tests-cc-rest.txt | head -6
race() {  # kernel, label, limit, sanitize_step options (--through WAVE or none), then compute-sanitizer options...
  local v=$1 label=$2 limit=$3 step=$4; shift 4
  cp variants/$v.so $so
  timeout $limit $cs --tool racecheck --racecheck-report all --print-limit 20 "$@" \
    python3 tests/gpu/sanitize_step.py /tmp/nmc-2l --lengths 300,0 $step > $res/racecheck-$v-$label.txt 2>&1
  echo "$v $label racecheck rc=$? ($(( $(date +%s) - start )) s)"
  grep -E "RACECHECK SUMMARY|step ok" $res/racecheck-$v-$label.txt
  grep -E "Error: Potential" $res/racecheck-$v-$label.txt | sed 's/ at __shared__.*//' | sort | uniq -c
}
for v in "$@"; do
  left=$(( 570 - ($(date +%s) - start) )); [ $left -lt 60 ] && { echo "$v: no time left"; continue; }
  if [ ${#filter[@]} -gt 0 ]; then race $v block17 $(( left < 120 ? left : 120 )) "" "${filter[@]}"; fi
  left=$(( 570 - ($(date +%s) - start) )); [ $left -lt 60 ] && continue
  race $v through-up $(( left < 180 ? left : 180 )) "--through mlp_up"
done
for v in "$@"; do
  left=$(( 570 - ($(date +%s) - start) )); [ $left -lt 60 ] && { echo "$v all blocks: no time left"; continue; }
  race $v all $(( left < 240 ? left : 240 )) ""
done
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

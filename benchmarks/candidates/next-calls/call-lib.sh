# Sourced by the kernel-alone call scripts (`source benchmarks/candidates/next-calls/call-lib.sh SECONDS`, from the
# repository root on the GPU host): the pieces every such call repeated. Sets res ($OUT/r, which `pack_results`
# turns into $OUT/r.tgz), so (the carried extension) and the time the call may take; records the GPU and the build.
#   left                 seconds left of the call's limit
#   stamp NAME RC        one line: a stage's name, exit status and the call's time so far
#   ab NAME BATCH SECONDS [--flag ...] VARIANT=SCHEDULE ...
#                        benchmarks.ab.interleaved: main's extension against each schedule on it, one process, an A/A
#                        control, 12 rounds at batch 1 and 8 above; extra flags (--copies 3) go before the variants
#   sanitize CASE SECONDS
#                        compute-sanitizer's three tools on tests/gpu/test_sanitizer.py's CASE, from the wheel carried
#                        in .sanitizer/ (skipped with a line if it was not)
#   kernel_tests SECONDS [PYTEST ARGS]
#                        tests/gpu/test_megakernel_step.py and test_each_opcode.py on the carried extension
#   profile BATCHES [SCHEDULES]
#                        benchmarks.kernel_profile with the time left (a timeout keeps the rows it finished)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-560}
so=vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
left() { echo $(( limit - ($(date +%s) - start) )); }
stamp() { echo "$1 rc=$2 ($(( $(date +%s) - start )) s)"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $res/gpu.txt
md5sum $so > $res/md5.txt
python3 -c "from vllm_megakernel import _C; print(_C.build_info())" | tee $res/build-info.txt

ab() {
  local name=$1 b=$2 lim=$3; shift 3
  [ $(left) -lt $(( lim + 5 )) ] && { echo "$name: skipped, $(left) s left"; return; }
  local args=(--variant base=$so)
  while [[ $# -gt 0 && $1 == --* ]]; do args+=("$1" "$2"); shift 2; done
  for v in "$@"; do args+=(--variant "${v%%=*}=$so@${v#*=}"); done
  timeout -k 5 $lim python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b \
    --rounds $([ $b = 1 ] && echo 12 || echo 8) --iters 20 --control "${args[@]}" --out $res/$name > $res/$name.log 2>&1
  stamp $name $?; cat $res/$name/table.md 2>/dev/null || tail -3 $res/$name.log
}

sanitize() {
  local case=$1 lim=$2
  if ! ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl > /dev/null 2>&1; then
    echo "sanitizer: skipped, .sanitizer/ was not carried"; return
  fi
  [ $(left) -lt $(( lim + 5 )) ] && { echo "sanitizer: skipped, $(left) s left"; return; }
  local cs; cs=$(bash benchmarks/candidates/next-calls/sanitizer-from-wheel.sh)
  COMPUTE_SANITIZER=$cs timeout -k 5 $lim python3 -m pytest -v -rA -p no:cacheprovider --durations=6 \
    tests/gpu/test_sanitizer.py -k "$case]" > $res/sanitizer-$case.txt 2>&1
  stamp "sanitizer $case" $?; tail -1 $res/sanitizer-$case.txt; grep -E "^(PASSED|FAILED|ERROR)" $res/sanitizer-$case.txt
}

kernel_tests() {
  local lim=$1; shift
  [ $(left) -lt $(( lim + 5 )) ] && { echo "kernel tests: skipped, $(left) s left"; return; }
  timeout -k 5 $lim python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
    tests/gpu/test_each_opcode.py "$@" > $res/kernel-tests.txt 2>&1
  stamp "kernel tests" $?; grep -E "^(FAILED|ERROR)" $res/kernel-tests.txt; tail -1 $res/kernel-tests.txt
}

profile() {
  local batches=$1 schedules=${2:-default}
  [ $(left) -gt 60 ] || { echo "profile: skipped, $(left) s left"; return; }
  timeout -k 5 $(( $(left) - 8 )) python3 -m benchmarks.kernel_profile --model configs/north-mini-code \
    --batch-sizes $batches --iters 10 --schedules "$schedules" --out $res/profile > $res/profile.log 2>&1
  stamp profile $?
  if [ -f $res/profile/report.md ]; then
    grep -A8 "^| batch | context" $res/profile/report.md | head -9; grep "^spans of every wave" $res/profile/report.md
  else
    tail -3 $res/profile.log
  fi
}

pack_results() { (cd $OUT && tar czf r.tgz r && rm -rf r); }

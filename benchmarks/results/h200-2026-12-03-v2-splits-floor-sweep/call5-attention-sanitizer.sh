#!/usr/bin/env bash
# Session R, device call 5 (same machine after call 4; carry vllm_megakernel/_C*.so, .offline-bundle/install.sh,
# env.sh, bundle.sha256 and .sanitizer/ with the nvidia-cuda-sanitizer-api 13.5.25 wheel = compute-sanitizer
# 2026.4.0): (1) issue #11's attention grid on the floor split rule (`benchmarks.attention_bench`, batch 1 / 8 / 64
# at 1K / 8K / 32K / 128K, batch 1 at 256K, against vLLM's FA3 on the same cache); (2) tests/gpu/test_sanitizer.py's
# ragged case (lengths 1 .. 128K and a padding row in one batch) under memcheck, synccheck and racecheck, its
# first run. `bash call5-attention-sanitizer.sh [SECONDS]` (default 570).
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res; start=$(date +%s); limit=${1:-570}
left() { echo $(( limit - ($(date +%s) - start) )); }
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 200 python -m benchmarks.attention_bench --model configs/north-mini-code --batch-sizes 1,8,64 \
  --contexts 1024,8192,32768,131072 --long-context 262144 --out $res/attention > $res/attention.log 2>&1
echo "attention rc=$? ($(( $(date +%s) - start )) s)"; cat $res/attention/table.md 2>/dev/null || tail -5 $res/attention.log
w=$(ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl); d=/tmp/cs-13.5.25; rm -rf $d; python3 -m zipfile -e $w $d
chmod -R u+x $d/nvidia/cu13; cs=$d/nvidia/cu13/bin/compute-sanitizer
for tool in memcheck synccheck racecheck; do
  t=$(( $(left) - 10 )); [ $t -lt 30 ] && { echo "$tool: no time left"; continue; }
  COMPUTE_SANITIZER=$cs MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout $t python -m pytest -q -rA -p no:cacheprovider \
    --durations=3 tests/gpu/test_sanitizer.py -k "ragged and $tool" > $res/sanitizer-$tool.txt 2>&1
  echo "ragged $tool rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/sanitizer-$tool.txt
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $res/sanitizer-$tool.txt | head -2
done
cd $OUT && tar czf r.tgz r && rm -rf r

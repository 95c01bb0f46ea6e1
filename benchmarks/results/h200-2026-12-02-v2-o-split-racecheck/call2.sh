#!/usr/bin/env bash
# Session N, device call 2 (a fresh machine; carry vllm_megakernel/_C*.so = main, variants/ with cc.so, pf.so,
# ccpf.so, f0.so, fp.so, and .sanitizer/): (1) the batch-64 step where ccpf failed check_new_kv in call 1, with
# each kernel's margins against the tests' K/V tolerance (diag_new_kv.py; the Python defaults of this commit,
# so batch 64 takes the O split); (2) racecheck with compute-sanitizer 2026.4.0 on a 2-layer step (one live row
# with a 300-token history and a padding row) for f0 then fp (PERF_LOG #76), in the time left.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
here=benchmarks/results/h200-2026-12-02-v2-o-split-racecheck
res=$OUT/r; mkdir -p $res
start=$(date +%s)
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
for v in main cc pf ccpf; do
  cp variants/$v.so $so 2>/dev/null || cp /tmp/main.so $so
  MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 90 python3 $here/diag_new_kv.py > $res/diag-$v.txt 2>&1
  echo "$v diag rc=$? ($(( $(date +%s) - start )) s)"; grep -E "run|output|layer [1-4]" $res/diag-$v.txt | cut -c1-150
done
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-2l --seed 1 --num-layers 2 > $res/ckpt2.log 2>&1
w=$(ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl); d=/tmp/cs-13.5.25; rm -rf $d; python3 -m zipfile -e $w $d
chmod -R u+x $d/nvidia/cu13; cs=$d/nvidia/cu13/bin/compute-sanitizer; $cs --version | tail -1 > $res/version.txt
for v in f0 fp; do
  left=$(( 580 - ($(date +%s) - start) )); [ $left -lt 60 ] && { echo "$v: no time left"; continue; }
  cp variants/$v.so $so
  timeout $(( left < 240 ? left : 240 )) $cs --tool racecheck --racecheck-report all --print-limit 20 \
    python3 tests/gpu/sanitize_step.py /tmp/nmc-2l --lengths 300,0 > $res/racecheck-$v.txt 2>&1
  echo "$v racecheck rc=$? ($(( $(date +%s) - start )) s)"
  grep -E "RACECHECK SUMMARY|step ok" $res/racecheck-$v.txt; grep -E "Error: Potential" $res/racecheck-$v.txt | sed 's/ at __shared__.*//' | sort | uniq -c
done
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

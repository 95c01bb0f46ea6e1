#!/usr/bin/env bash
# Session M, device call 1c (same machine as call 1, its checkpoint /tmp/nmc-5l there; carry main's extension
# and .sanitizer/ with the compute-sanitizer wheels from PyPI, nvidia-cuda-sanitizer-api 13.5.25 =
# compute-sanitizer 2026.4.0 and 13.1.118 = 2025.4.1): the host has 2025.3.1 (session L), older than the
# racecheck false-positive fixes for mbarriers (2025.4), warpgroup synchronization (2026.1) and mbarrier
# complete-tx (2026.3) that README's "Not yet clean" cites. The newest that runs on the host's driver, then
# racecheck on one step (tests/gpu/sanitize_step.py: batch 3, 5 full-width layers), capped at ~400 s in all.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
[ -d /tmp/nmc-5l ] || python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1
best=
for w in .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl .sanitizer/nvidia_cuda_sanitizer_api-13.1.118-*.whl; do
  d=/tmp/cs-$(basename $w | cut -d- -f2); rm -rf $d; python3 -m zipfile -e $w $d
  chmod -R u+x $d/nvidia/cu13
  bin=$(ls $d/nvidia/cu13/compute-sanitizer/compute-sanitizer $d/nvidia/cu13/bin/compute-sanitizer 2>/dev/null | head -1)
  echo "== $w -> $bin" >> $res/versions.txt; $bin --version >> $res/versions.txt 2>&1
  timeout 90 $bin --tool memcheck python3 -c "import torch; torch.ones(4, device='cuda').sum().item(); print('cuda ok')" \
       > $res/smoke-$(basename $d).txt 2>&1
  echo "$w: smoke rc=$? ($(( $(date +%s) - start )) s)"; tail -2 $res/smoke-$(basename $d).txt
  if grep -q "cuda ok" $res/smoke-$(basename $d).txt; then best=$bin; break; fi
done
cat $res/versions.txt
if [ -n "$best" ]; then
  echo "using $best"
  timeout $(( 400 - ($(date +%s) - start) )) $best --tool racecheck --racecheck-report all --print-limit 40 \
    python3 tests/gpu/sanitize_step.py /tmp/nmc-5l > $res/racecheck.txt 2>&1
  echo "racecheck rc=$? ($(( $(date +%s) - start )) s)"; grep -E "RACECHECK SUMMARY|step ok|Error|Warning" $res/racecheck.txt | sort | uniq -c | head -12
fi
cd $OUT && tar czf r.tgz r && rm -rf r

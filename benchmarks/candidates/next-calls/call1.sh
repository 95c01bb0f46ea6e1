#!/usr/bin/env bash
# Next session, device call 1 (a fresh machine; carry vllm_megakernel/_C*.so = main, variants/ with base.so, f0.so,
# fl.so, and .sanitizer/ with nvidia-cuda-sanitizer-api 13.5.25 = compute-sanitizer 2026.4.0; see ../README.md):
# racecheck with 2026.4.0 on a step it can finish inside one call (2 full-width layers, dense + MoE, one live
# row and a padding row, a 300-token history) for each kernel named as an argument, in order, e.g.
#   bash call1.sh fp f0 fl base
# f0 / fl: a fence.proxy.async.shared::cta before the stage release, in the releasing lane / in every lane
# (proxy-fence-lane0.patch / proxy-fence-each-lane.patch); fp: one in the producer before each stage's copies
# (proxy-fence-producer.patch); base: main, whose records the session-M run showed.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s)
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-2l --seed 1 --num-layers 2 > $res/ckpt.log 2>&1
w=$(ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl); d=/tmp/cs-13.5.25; rm -rf $d; python3 -m zipfile -e $w $d
chmod -R u+x $d/nvidia/cu13; cs=$d/nvidia/cu13/bin/compute-sanitizer; $cs --version | tail -1 > $res/version.txt
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
for v in "$@"; do
  left=$(( 560 - ($(date +%s) - start) )); [ $left -lt 60 ] && { echo "$v: no time left"; continue; }
  cp variants/$v.so $so
  timeout $(( left < 170 ? left : 170 )) $cs --tool racecheck --racecheck-report all --print-limit 20 \
    python3 tests/gpu/sanitize_step.py /tmp/nmc-2l --lengths 300,0 > $res/racecheck-$v.txt 2>&1
  echo "$v racecheck rc=$? ($(( $(date +%s) - start )) s)"
  grep -E "RACECHECK SUMMARY|step ok" $res/racecheck-$v.txt; grep -E "Error: Potential" $res/racecheck-$v.txt | sed 's/ at __shared__.*//' | sort | uniq -c
done
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session O, device call 3 (a fresh machine; carry vllm_megakernel/_C*.so = main at the cc commit, variants/ with
# base.so (= main) and fad.so (candidate proxy-fence-and-descriptor-arrive-each-lane: fa + every consumer lane
# arrives on the descriptor slot's empty barrier), .sanitizer/ with compute-sanitizer 2026.4.0):
# racecheck of fad on the whole 2-layer step (call 2: fa's only records left were the descriptor ring's, lane 0's
# arrival after __syncwarp() naming lanes 1-31's reads), the A/B base / fad at batch 64, then fad's kernel tests
# (opcode tests first) in the time left (the session's last ~420 device seconds).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res
start=$(date +%s); limit=380
python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-2l --seed 1 --num-layers 2 > $res/ckpt.log 2>&1
w=$(ls .sanitizer/nvidia_cuda_sanitizer_api-13.5.25-*.whl); d=/tmp/cs-13.5.25; rm -rf $d; python3 -m zipfile -e $w $d
chmod -R u+x $d/nvidia/cu13; cs=$d/nvidia/cu13/bin/compute-sanitizer
so=$(ls vllm_megakernel/_C*.so); cp $so /tmp/main.so
cp variants/fad.so $so
timeout 90 $cs --tool racecheck --racecheck-report all --print-limit 20 \
  python3 tests/gpu/sanitize_step.py /tmp/nmc-2l --lengths 300,0 > $res/racecheck-fad-all.txt 2>&1
echo "fad racecheck rc=$? ($(( $(date +%s) - start )) s)"; grep -E "RACECHECK SUMMARY|step ok" $res/racecheck-fad-all.txt
grep -E "Error: Potential" $res/racecheck-fad-all.txt | sed 's/ at __shared__.*//' | sort | uniq -c
cp /tmp/main.so $so
timeout 120 bash benchmarks/ab/run.sh variants $res/ab 64 base fad > $res/ab.log 2>&1
echo "ab rc=$? ($(( $(date +%s) - start )) s)"; tail -4 $res/ab.log
cp variants/fad.so $so  # the opcode tests first (~25 s), then the step tests in the time left
MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout $(( limit - ($(date +%s) - start) )) python3 -m pytest -q -rA -p no:cacheprovider \
  --durations=8 tests/gpu/test_each_opcode.py tests/gpu/test_megakernel_step.py > $res/tests-fad.txt 2>&1
echo "fad tests rc=$? ($(( $(date +%s) - start )) s)"; tail -1 $res/tests-fad.txt
grep -E "^FAILED|^E  +AssertionError" $res/tests-fad.txt | head -6
cp /tmp/main.so $so
cd $OUT && tar czf r.tgz r && rm -rf r

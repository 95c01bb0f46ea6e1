#!/usr/bin/env bash
# Next session (after the stash calls (one per bundle piece) on the same machine; carry vllm_megakernel/_C*.so,
# .offline-bundle/install.sh, env.sh, bundle.sha256): `benchmarks.step_profile`, both sides in one call, each in
# its own engine (its start-up is recorded too):
#   bash call-step-profile.sh prefill 1 1024 8     # the megakernel side's doubled TTFT (session X call 4)
#   bash call-step-profile.sh decode 8 1024 32     # batch 8's step inside vLLM against the kernel alone (TPOT at 8)
#   bash call-step-profile.sh decode,prefill 8 1024 32 570 1   # both in one engine a side: batch 8's decode
#                                                              # steps, then prefills of one prompt
# `bash call-step-profile.sh PHASES BATCH CONTEXT STEPS [SECONDS] [PREFILL_BATCH]`
set -u
export PYTHONUNBUFFERED=1
phase=${1:?prefill, decode or decode,prefill}; batch=${2:?batch}; ctx=${3:?context}; steps=${4:?steps}
limit=${5:-570}; pbatch=${6:-$batch}
res=$OUT/r; mkdir -p $res; start=$(date +%s)
source benchmarks/candidates/next-calls/bundle-env.sh $res
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $res/gpu.txt 2>&1
name=${phase/,/-}-b$batch-$ctx
timeout $(( limit - ($(date +%s) - start) )) python -m benchmarks.step_profile --model configs/north-mini-code \
  --load-format dummy --phase $phase --prefill-batch $pbatch --batch $batch --context $ctx --steps $steps --out $res/$name > $res/$name.log 2>&1
echo "step_profile $name rc=$? ($(( $(date +%s) - start )) s)"
rm -rf $res/$name/*-trace  # chrome traces are tens of MB; the tables keep what they say
grep -h "^#\|median\|step wall" $res/$name/table.md | cut -c1-400
cd $OUT && tar czf r.tgz r && rm -rf r

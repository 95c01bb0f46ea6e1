#!/usr/bin/env bash
# Session G, device call 2: the expert-slack candidate (slack/: main's tree with
# benchmarks/candidates/expert-slack-slots.patch applied, its extension built on the CPU machine; slackpf.so:
# the same plus o-proj-l2-prefetch.patch) at batch 8 and 16, with o_within_down and norm=wave, and main's
# default from the checkout's root.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; res=$OUT/r; mkdir -p $res
S=$R/slack; so=$S/vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
prof() {  # NAME DIR BATCHES SCHEDULES
  (cd $2 && PYTHONPATH=$PWD timeout 200 python3 -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes $3 \
     --iters 20 --schedules "$4" --out $res/$1 > $res/$1.log 2>&1; echo "$1 rc=$?")
}
(cd $S && PYTHONPATH=$S python3 -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5 > $res/ckpt.log 2>&1)
export MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l
(cd $S && PYTHONPATH=$S timeout 120 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py tests/gpu/test_each_opcode.py \
  > $res/tests-slack.txt 2>&1; echo "slack tests rc=$?"; tail -1 $res/tests-slack.txt)
prof slack-1 $S 8,16 "default;expert_slack=16;expert_slack=32;o_within_down=0.7;o_within_down=0.9;o_within_down=0.8,expert_slack=32;o_within_down=0.8,norm=wave;o_within_down=0.8,expert_slack=32,norm=wave"
cp $S/variants/slackpf.so $so
prof slackpf-2 $S 8,16 "default;o_within_down=0.8,expert_slack=32"
(cd $S && PYTHONPATH=$S timeout 80 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
  > $res/tests-slackpf.txt 2>&1; echo "slackpf tests rc=$?"; tail -1 $res/tests-slackpf.txt)
cp $S/variants/slack.so $so
prof main-3 $R 8,16 "default"
prof slack-4 $S 8,16 "default;o_within_down=0.8,expert_slack=32"
grep -h "per step" $res/*.log
cd $OUT && tar czf r.tgz r && rm -rf r

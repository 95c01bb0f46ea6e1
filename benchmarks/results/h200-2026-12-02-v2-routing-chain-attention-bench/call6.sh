#!/usr/bin/env bash
# Session J (2026-12-02), device call 6 (after call 5 and four `install.sh --stash` calls on the same machine;
# main's extension carried): call 3 again after its fix (the MoE-only model of attention_bench was refused for
# its dense width): the attention wave alone against vLLM's FlashAttention 3 decode on the same paged cache
# (#11), the default grid, fewer timed replays to fit the session's device time; results written per point.
set -u
export PYTHONUNBUFFERED=1
res=$OUT/r; mkdir -p $res
env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; tail -1 $res/install.txt
export PYTHONPATH=$PWD; source .offline-bundle/env.sh
timeout 200 python -m benchmarks.attention_bench --model configs/north-mini-code --long-context 262144 \
  --iters 10 --reps 5 --out $res/attention > $res/attention.log 2>&1
echo "attention rc=$?"; cat $res/attention/table.md 2>/dev/null; tail -4 $res/attention.log
cd $OUT && tar czf r.tgz r && rm -rf r

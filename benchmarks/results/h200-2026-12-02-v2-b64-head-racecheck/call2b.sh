#!/usr/bin/env bash
# Session M, device call 2b: call 2 again without its step tests (they had passed in call 2, whose vLLM install
# failed: the first of the five stash calls had found no machine, so piece p0 was missing; p0 stashed again
# before this call). Same carry as call 2. Run as one line on the device tool:
export PYTHONUNBUFFERED=1; res=$OUT/r; mkdir -p $res; env -u PYTHONPATH bash .offline-bundle/install.sh --no-project . > $res/install.txt 2>&1; echo "install rc=$?"; export PYTHONPATH=$PWD; source .offline-bundle/env.sh; timeout 470 python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy --batch-sizes 64,8,1 --contexts 8192 --new-tokens 256 --cache-prompts --out $res/sweep > $res/sweep.log 2>&1; echo "sweep rc=$?"; cat $res/sweep/table.md; cd $OUT && tar czf r.tgz r && rm -rf r

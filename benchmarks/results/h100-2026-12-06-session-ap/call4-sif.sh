#!/usr/bin/env bash
# Session AP, call 4 (the same warm H100 right after call 3; carry the extension only): the stage ring's cap on
# stages in flight at batch 1 and 2 against main's (2 at batch 1, 3 at batch 2), one process a batch with an A/A
# control, 12 rounds of 20 launches. The command as it ran, in one line:
mkdir -p $OUT/r && export PYTHONPATH=$PWD && so=vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so && for b in 1 2; do timeout 150 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes $b --rounds 12 --iters 20 --control --variant base=$so --variant sif3=$so@stages_in_flight=3 --variant sif4=$so@stages_in_flight=4 --variant sif5=$so@stages_in_flight=5 --out $OUT/r/b$b > $OUT/r/b$b.log 2>&1; echo b$b rc=$?; cat $OUT/r/b$b/table.md; done; cd $OUT && tar czf r.tgz r && rm -rf r

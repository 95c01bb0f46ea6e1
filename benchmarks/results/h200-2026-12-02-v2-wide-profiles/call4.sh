#!/usr/bin/env bash
# Session K, the call right after call 3 (same machine; main's extension and variants/ with base.so and
# grpk.so carried): the A/B base / grpk at batch 8 and 16 (the top-k change runs there too). Run exactly as
# this one command line:
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT/r; timeout 200 bash benchmarks/ab/run.sh variants $OUT/r/ab4 8,16 base grpk base grpk > $OUT/r/ab4.log 2>&1; echo rc=$?; tail -7 $OUT/r/ab4.log

#!/usr/bin/env bash
# Does the megakernel's slow level inside vLLM come from where its blocks land (PERF_LOG #93/#94, #175)? After the
# stash calls on the same machine; carry vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so, variants/base.so,
# variants/smid.so (both built by `PYTHON=/work/venv312/bin/python bash benchmarks/ab/build.sh variants HEAD base
# smid=benchmarks/candidates/sm-lists-by-smid.patch`), .offline-bundle/install.sh, env.sh, bundle.sha256.
# The megakernel side of the decode sweep alone (batch 1, 2, 4, 8 at 8K, REPEATS runs a case) with main's extension,
# smid's, then main's again, each its own engine; then every run's step in ms beside each other (runs.md).
# `bash call-smid-vllm.sh [SECONDS] [REPEATS]` (default 560 / 5). Results in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1
limit=${1:-560}; repeats=${2:-5}
res=$OUT/r; mkdir -p $res; start=$(date +%s)
source benchmarks/candidates/next-calls/bundle-env.sh $res
nvidia-smi --query-gpu=index,timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -l 5 \
  > $res/gpu-clocks.csv 2>&1 & clocks=$!
so=vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
# main, smid, main again: each its own engine, so that a drift over the call (the GPU warming up) shows as the two
# main runs disagreeing rather than as smid's difference
order=(base smid base2); n=0
for run in "${order[@]}"; do
  v=${run%2}; n=$((n + 1))
  cp variants/$v.so $so
  python3 -c "from vllm_megakernel import _C; print('$run', _C.build_info())" | tee -a $res/build-info.txt
  left=$(( (limit - 20 - ($(date +%s) - start)) / (${#order[@]} - n + 1) ))  # an even share of what is left
  [ $left -gt 60 ] || { echo "$run: skipped, $left s left"; continue; }
  timeout -k 15 $left python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy \
    --sides megakernel --batch-sizes 1,2,4,8 --contexts 8192 --new-tokens 256 --cache-prompts \
    --repeats $repeats --out $res/sweep-$run > $res/sweep-$run.log 2>&1
  echo "$run rc=$? ($(( $(date +%s) - start )) s)"
done
kill $clocks 2>/dev/null
cp variants/base.so $so
python3 - $res <<'EOF2' | tee $res/runs.md
import json, sys
from pathlib import Path
res = Path(sys.argv[1])
order = ("base", "smid", "base2")
runs = {}
for run in order:
    f = res / f"sweep-{run}" / "results.json"
    if f.exists():
        for c in json.loads(f.read_text())["cases"]:
            if c["status"] == "ok":
                runs[run, c["batch"]] = [1000 / x for x in c["per_request_tok_s"]]
print("each run's decode step, ms (1000 / per-request tok/s)\n")
print("| batch | main | smid | main again |")
print("|---|---|---|---|")
for b in (1, 2, 4, 8):
    cells = [" ".join(f"{x:.3f}" for x in runs.get((run, b), [])) or "-" for run in order]
    print(f"| {b} | " + " | ".join(cells) + " |")
EOF2
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Does the megakernel's slow level inside vLLM come from where its blocks land (PERF_LOG #93/#94, #175)? After the
# stash calls on the same machine; carry vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so, variants/base.so,
# variants/smid.so (both built by `PYTHON=/work/venv312/bin/python bash benchmarks/ab/build.sh variants HEAD base
# smid=benchmarks/candidates/sm-lists-by-smid.patch`), .offline-bundle/install.sh, env.sh, bundle.sha256.
# The megakernel side of the decode sweep alone (batch 1, 2, 4, 8 at 8K, REPEATS runs a case), once with main's
# extension and once with smid's, each its own engine, then every run's step in ms beside each other.
# `bash call-smid-vllm.sh [SECONDS] [REPEATS]` (default 560 / 6). Results in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1
limit=${1:-560}; repeats=${2:-6}
res=$OUT/r; mkdir -p $res; start=$(date +%s)
source benchmarks/candidates/next-calls/bundle-env.sh $res
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -l 5 \
  > $res/gpu-clocks.csv 2>&1 & clocks=$!
so=vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
for v in base smid; do
  cp variants/$v.so $so
  python3 -c "from vllm_megakernel import _C; print('$v', _C.build_info())" | tee -a $res/build-info.txt
  share=1; [ $v = base ] && share=2  # main gets half the time left, smid the rest
  left=$(( (limit - ($(date +%s) - start)) / share ))
  timeout $left python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy \
    --sides megakernel --batch-sizes 1,2,4,8 --contexts 8192 --new-tokens 256 --cache-prompts \
    --repeats $repeats --out $res/sweep-$v > $res/sweep-$v.log 2>&1
  echo "$v rc=$? ($(( $(date +%s) - start )) s)"
done
kill $clocks 2>/dev/null
cp variants/base.so $so
python3 - $res <<'EOF'
import json, sys
from pathlib import Path
res = Path(sys.argv[1])
runs = {}
for v in ("base", "smid"):
    f = res / f"sweep-{v}" / "results.json"
    if f.exists():
        for c in json.loads(f.read_text())["cases"]:
            if c["status"] == "ok":
                runs[v, c["batch"]] = [1000 / x for x in c["per_request_tok_s"]]
print("| batch | main: each run's step ms | smid: each run's step ms |")
print("|---|---|---|")
for b in (1, 2, 4, 8):
    cells = [" ".join(f"{x:.3f}" for x in runs.get((v, b), [])) or "-" for v in ("base", "smid")]
    print(f"| {b} | {cells[0]} | {cells[1]} |")
EOF
cd $OUT && tar czf r.tgz r && rm -rf r

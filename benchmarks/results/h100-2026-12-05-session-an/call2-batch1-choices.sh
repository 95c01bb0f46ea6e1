#!/usr/bin/env bash
# Call 2 (session AN): call 1's batch-1 winners again, with more rounds and together, in one process with an A/A
# control (`benchmarks.ab.interleaved`, the kernel alone at 8K): pr (posted_routing=1), u48 (moe_up_cols=48: 128
# up/gate tiles, one an SM), u48pr (both), and op (o_prefetch=1, PERF_LOG #179's H200 prediction). Then the step tests with both as batch 1's defaults (layout.py edited on
# the device's copy only). Carry vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so built from main.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
res=$OUT/r; mkdir -p $res; start=$(date +%s)
so=vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so
nvidia-smi --query-gpu=name,driver_version --format=csv > $res/gpu.txt
timeout -k 5 120 python3 -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes 1 \
  --rounds 12 --iters 20 --control --variant base=$so --variant pr=$so@posted_routing=1 \
  --variant u48=$so@moe_up_cols=48 --variant u48pr=$so@moe_up_cols=48,posted_routing=1 --variant op=$so@o_prefetch=1 --out $res/b1 > $res/b1.log 2>&1
echo "b1 rc=$? ($(( $(date +%s) - start )) s)"; cat $res/b1/table.md 2>/dev/null || tail -3 $res/b1.log
python3 - <<'PY'
import re, pathlib
p = pathlib.Path("vllm_megakernel/megakernel/layout.py"); s = p.read_text()
s = s.replace("96 if 2 <= batch <= REGISTER_BATCH else 32", "96 if 2 <= batch <= REGISTER_BATCH else 48 if batch == 1 else 32", 1)
s = re.sub(r"(def posted_routing_for\(batch: int\) -> bool:\n    \"\"\".*?\"\"\"\n    return )False", r"\1batch == 1", s, count=1, flags=re.S)
p.write_text(s)
PY
git diff --stat 2>/dev/null; python3 -c "
from vllm_megakernel.megakernel import layout; print('batch-1 defaults: posted', layout.posted_routing_for(1), 'batch 2', layout.posted_routing_for(2))"
timeout -k 5 $(( 480 - ($(date +%s) - start) )) python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megakernel_step.py \
  > $res/u48pr-step-tests.txt 2>&1
echo "u48pr step tests rc=$? ($(( $(date +%s) - start )) s)"; grep -E "^(FAILED|ERROR)" $res/u48pr-step-tests.txt; tail -1 $res/u48pr-step-tests.txt
cd $OUT && tar czf r.tgz r && rm -rf r

# Run from the repository root: python benchmarks/results/h100-2026-12-05-session-al/itl_split.py
"""Each side's inter-token latencies at each concurrency (vLLM bench's per-request `itls`, taken at the client),
split into decode steps and prefill interruptions: an ITL of at least 3x the median is a step that held another
request's prefill (chunked prefill puts it in the step, and such a step runs stock vLLM on both sides). Per side
and level: the decode steps' mean ITL, the interruptions' time spread over every token, and, for comparison, the
decode step of the sweep in this folder at the same batch and 8K (1000 / its median per-request tok/s)."""
import json
import statistics as st
import tarfile
from pathlib import Path

here = Path(__file__).parent
# the bench files were packed into serve-8192/bench.tar.xz in session AQ (the tree that travels to the GPU host)
with tarfile.open(here / "serve-8192/bench.tar.xz") as tar:
    benches = {m.name: json.load(tar.extractfile(m)) for m in tar.getmembers()}
cases = json.loads((here / "sweep-b1-8/sweep/results.json").read_text())["cases"]
sweep_ms = {(c["side"], c["batch"]): 1000 / st.median(c["per_request_tok_s"]) for c in cases if c["status"] == "ok"}
print("| concurrency | side | decode-step ITL mean ms | sweep step ms | interruptions | interruption ms a token | "
      "mean ITL ms |")
print("|---|---|---|---|---|---|---|")
for c in (1, 4, 8, 32):
    for side in ("stock", "megakernel"):
        bench = benches[f"bench-{side}-c{c}.json"]
        itls = [1000 * x for r in bench["itls"] for x in r]
        med = st.median(itls)
        decode = [x for x in itls if x < 3 * med]
        big = [x for x in itls if x >= 3 * med]
        step = sweep_ms.get((side, c))
        print(f"| {c} | {side} | {st.mean(decode):.2f} | {'-' if step is None else f'{step:.2f}'} | "
              f"{len(big)} of {len(itls)} | {sum(big) / len(itls):.2f} | {st.mean(itls):.2f} |")

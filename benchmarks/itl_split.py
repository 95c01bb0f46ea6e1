"""Where a serving run's TPOT goes: each side's inter-token latencies at each concurrency (vLLM bench's per-request
``itls``, taken at the client) split into decode steps and prefill interruptions.

An ITL of at least 3x the side's median at that level is a step that held another request's prefill (chunked
prefill puts it in the step, and such a step runs stock vLLM on both sides); the rest are decode steps. Per side
and level: the decode steps' mean ITL, how many interruptions, the interruptions' time spread over every token,
and the mean ITL; beside them the decode step a ``decode_sweep`` run measured at the same batch (1000 / the median
per-request tok/s), where one is given and has that batch (PERF_LOG #174: TPOT ~ decode step + interruptions).

    python -m benchmarks.itl_split --bench SERVE_DIR/bench.tar.xz [--sweep SWEEP_DIR/results.json] \
        [--levels 1,4,8,32]

``--bench`` takes the packed bench files (``bench-SIDE-cN.json``, as the results folders keep them) or a serve
folder holding them, loose or in its ``bench.tar.xz``.
"""

from __future__ import annotations

import argparse
import json
import statistics as st
import tarfile
from pathlib import Path

SIDES = ("stock", "megakernel")
INTERRUPTION_FACTOR = 3.0  # an ITL this many times the median held a prefill


def load_benches(path: Path) -> dict[str, dict]:
    """``bench-SIDE-cN.json`` name -> its contents, from a tar archive or a serve folder: the folder's own files and
    those packed in its ``bench.tar.xz`` (results folders pack them to keep the tree that travels to the GPU host
    small), a loose file before a packed one of the same name; empty for a folder with neither."""
    if not path.is_dir():
        with tarfile.open(path) as tar:
            return {Path(m.name).name: json.load(tar.extractfile(m)) for m in tar.getmembers() if m.isfile()}
    packed = load_benches(path / "bench.tar.xz") if (path / "bench.tar.xz").exists() else {}
    return packed | {p.name: json.loads(p.read_text()) for p in sorted(path.glob("bench-*.json"))}


def sweep_steps_ms(results: dict) -> dict[tuple[str, int], float]:
    """(side, batch) -> the decode step in ms of a decode_sweep run (1000 / median per-request tok/s)."""
    return {(c["side"], c["batch"]): 1000 / st.median(c["per_request_tok_s"])
            for c in results["cases"] if c["status"] == "ok"}


def split(itls_s: list[list[float]]) -> dict[str, float]:
    """One side's level: its requests' ITLs (seconds) split at INTERRUPTION_FACTOR x their median."""
    itls = [1000 * x for r in itls_s for x in r]
    if not itls:
        raise ValueError("no inter-token latencies: the bench file holds no decoded tokens")
    med = st.median(itls)
    decode = [x for x in itls if x < INTERRUPTION_FACTOR * med]
    big = [x for x in itls if x >= INTERRUPTION_FACTOR * med]
    return {"decode_ms": st.mean(decode), "interruptions": len(big), "tokens": len(itls),
            "interruption_ms_per_token": sum(big) / len(itls), "mean_ms": st.mean(itls)}


def table(benches: dict[str, dict], levels: list[int], sweep_ms: dict[tuple[str, int], float]) -> str:
    lines = ["| concurrency | side | decode-step ITL mean ms | sweep step ms | interruptions | "
             "interruption ms a token | mean ITL ms |",
             "|---|---|---|---|---|---|---|"]
    for c in levels:
        for side in SIDES:
            name = f"bench-{side}-c{c}.json"
            if name not in benches:
                raise KeyError(f"{name} is not among the bench files ({', '.join(sorted(benches))})")
            s = split(benches[name]["itls"])
            step = sweep_ms.get((side, c))
            lines.append(f"| {c} | {side} | {s['decode_ms']:.2f} | {'-' if step is None else f'{step:.2f}'} | "
                         f"{s['interruptions']} of {s['tokens']} | {s['interruption_ms_per_token']:.2f} | "
                         f"{s['mean_ms']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", type=Path, required=True, help="bench.tar.xz or a folder of bench-SIDE-cN.json")
    ap.add_argument("--sweep", type=Path, help="a decode_sweep results.json for the sweep step column")
    ap.add_argument("--levels", default="1,4,8,32", help="concurrency levels, comma-separated")
    args = ap.parse_args(argv)
    sweep_ms = sweep_steps_ms(json.loads(args.sweep.read_text())) if args.sweep else {}
    print(table(load_benches(args.bench), [int(x) for x in args.levels.split(",")], sweep_ms))


if __name__ == "__main__":
    main()

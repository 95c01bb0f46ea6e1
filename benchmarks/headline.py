"""The README's headline tables: the megakernel against stock vLLM at each point issue #12 names, on an H200, each
point from the newest committed run that measured it, with the issue's target beside it and a link to the run's
folder. Nothing is typed in by hand: the figures are read from the committed results, and a CPU test checks that
the README's block is what this module makes of them.

    python -m benchmarks.headline            # print the tables
    python -m benchmarks.headline --write    # replace the README's block between the two markers

Inside vLLM (benchmarks.decode_sweep, both sides in one run): a sweep folder listed later replaces an earlier one
at every (routing, batch, context) it measured. Through the server (benchmarks.serve_load, one side a call): a
level counts from the newest folder that holds both sides of it, each side's figures from its own
`side-*.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from benchmarks.report import summarize

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
README = REPO / "README.md"
BEGIN = "<!-- headline: benchmarks/headline.py writes this block; do not edit it by hand -->"
END = "<!-- headline end -->"

# The session whose kernel is main's (csrc/ as at 7503110, ABI 19); a row measured in another session is marked
# as an older kernel's.
CURRENT_KERNEL_SESSION = "AM"


@dataclasses.dataclass(frozen=True)
class Source:
    folder: str  # under benchmarks/results
    session: str  # the session that ran it, for the kernel column


# oldest first: a later sweep replaces an earlier one at every point it measured
SWEEPS = (
    Source("h200-2026-12-04-v2-local-routing/call3/sweep", "V"),  # batch 1-16, 8K
    Source("h200-2026-12-04-v2-local-routing/call4/sweep", "V"),  # batch 1 at 1K, 32K, 128K
    Source("h200-2026-12-04-v2-local-routing/call5/sweep", "V"),  # uniform routing, batch 1 and 8
    Source("h200-2026-12-04-v2-session-x/call3/sweep", "X"),  # batch 32, 64
    Source("h200-2026-12-05-session-am/call9-sweep/sweep", "AM"),  # batch 1-8, 8K
)
SERVING = (
    Source("h200-2026-12-04-v2-session-ab", "AB"),  # 1K at 32 / 64, 8K at 1 / 4 / 8
    Source("h200-2026-12-04-v2-session-ad/serve-1024", "AD"),  # 1K at 1 / 4 / 8
)


def sweep_floor(routing: str, batch: int, context: int) -> float | None:
    """Issue #12's floor for the megakernel / stock tok/s ratio at a point (the uniform-routing grid is "the same
    grid"): batch 1 / 2 / 4 / 8 at 8K at least 1.5 / 1.4 / 1.3 / 1.2x, 16-64 no slower than stock, batch 1 at
    1K, 32K and 128K at least 1.4x."""
    if context == 8192:
        return {1: 1.5, 2: 1.4, 4: 1.3, 8: 1.2}.get(batch, 1.0 if 16 <= batch <= 64 else None)
    if batch == 1 and context in (1024, 32768, 131072):
        return 1.4
    return None


def _k(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def _link(folder: str, text: str) -> str:
    return f"[{text}](benchmarks/results/{folder})"


def _kernel(session: str) -> str:
    return "current" if session == CURRENT_KERNEL_SESSION else f"session {session}'s"


def sweep_points(sources=SWEEPS, results: Path = RESULTS) -> dict[tuple[str, int, int], dict]:
    """(routing, batch, context) -> the newest row measuring it, with the source it came from."""
    points: dict[tuple[str, int, int], dict] = {}
    for src in sources:
        result = json.loads((results / src.folder / "results.json").read_text())
        if "H200" not in result["env"]["gpu"]:
            raise ValueError(f"{src.folder} ran on {result['env']['gpu']}: the headline tables are the H200's")
        routing = "uniform" if result["env"].get("routing_simulation", "off") != "off" else "weights"
        for row in summarize(result):
            if row.get("stock") and row.get("megakernel"):
                points[(routing, row["batch"], row["context"])] = {**row, "source": src}
    return points


def sweep_table(sources=SWEEPS, results: Path = RESULTS) -> list[str]:
    lines = ["| routing | batch | context | stock tok/s | megakernel tok/s | ratio | issue #12 | megakernel % of SOL | "
             "kernel | run |", "|---|---|---|---|---|---|---|---|---|---|"]
    order = lambda key: (key[0] != "weights", key[2] != 8192, key[2], key[1])  # noqa: E731
    points = sweep_points(sources, results)
    for routing, batch, context in sorted(points, key=order):
        row = points[(routing, batch, context)]
        floor = sweep_floor(routing, batch, context)
        verdict = "-" if floor is None else (f">= {floor}x: " + ("met" if row["ratio"] >= floor else "**missed**"))
        lines.append(f"| {routing} | {batch} | {_k(context)} | {row['stock']:.0f} | {row['megakernel']:.0f} | "
                     f"**{row['ratio']:.2f}x** | {verdict} | {row['megakernel_pct_sol']:.0f}% | "
                     f"{_kernel(row['source'].session)} | {_link(row['source'].folder, row['source'].folder.split('/')[0])} |")
    return lines


def serving_points(sources=SERVING, results: Path = RESULTS) -> dict[tuple[int, int], dict]:
    """(prompt tokens, concurrency) -> each side's row from the newest folder holding both sides of it without a
    failed request."""
    points: dict[tuple[int, int], dict] = {}
    for src in sources:
        found: dict[tuple[int, int], dict] = {}
        for path in sorted((results / src.folder).rglob("side-*.json")):
            side_file = json.loads(path.read_text())
            side = path.stem.removeprefix("side-")
            for row in side_file["rows"]:
                key = (side_file["settings"]["input_len"], row["concurrency"])
                if side in found.setdefault(key, {}):
                    raise ValueError(f"{src.folder}: {side} measured {key} twice; which one counts?")
                found[key][side] = {**row, "file": path.relative_to(results).parent.as_posix()}
        for key, sides in found.items():
            if {"stock", "megakernel"} <= set(sides) and all(s["failed"] == 0 for s in sides.values()):
                points[key] = {**sides, "source": src}
    return points


def serving_table(sources=SERVING, results: Path = RESULTS) -> list[str]:
    lines = ["| prompt | concurrency | median TPOT ms stock / megakernel | TPOT ratio | output tok/s stock / megakernel | "
             "ratio | issue #12 | kernel | runs |", "|---|---|---|---|---|---|---|---|---|"]
    points = serving_points(sources, results)
    for prompt, conc in sorted(points):
        p = points[(prompt, conc)]
        s, m = p["stock"], p["megakernel"]
        tpot = m["median_tpot_ms"] / s["median_tpot_ms"]
        out = m["output_tok_s"] / s["output_tok_s"]
        if conc <= 8:
            verdict = "TPOT <= 0.7x: " + ("met" if tpot <= 0.7 else "**missed**")
        else:
            verdict = "tok/s >= stock: " + ("met" if out >= 1.0 else "**missed**")
        runs = ", ".join(_link(x["file"], side) for side, x in (("stock", s), ("megakernel", m)))
        lines.append(f"| {_k(prompt)} | {conc} | {s['median_tpot_ms']:.2f} / {m['median_tpot_ms']:.2f} | "
                     f"**{tpot:.2f}x** | {s['output_tok_s']:.0f} / {m['output_tok_s']:.0f} | {out:.2f}x | {verdict} | "
                     f"{_kernel(p['source'].session)} | {runs} |")
    return lines


def block() -> str:
    return "\n".join([
        BEGIN,
        "Inside vLLM (`benchmarks.decode_sweep`, both sides in one run on one H200, vLLM's defaults, dummy weights, "
        "256 new tokens, median of 3 runs; SOL at the copy bandwidth measured in the same run). \"current\": main's "
        "kernel; a row from an older session ran an older kernel and is there until the current one is measured at "
        "that point.",
        "",
        *sweep_table(),
        "",
        "Through the server (`benchmarks.serve_load`, one side a call on one H200, 256 new tokens, each level after "
        "its warm-up wave).",
        "",
        *serving_table(),
        END,
    ])


def replace_block(text: str, new_block: str) -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError("README.md must hold the headline markers once each, begin before end")
    return text[:text.index(BEGIN)] + new_block + text[text.index(END) + len(END):]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the README's headline block")
    args = parser.parse_args(argv)
    if args.write:
        README.write_text(replace_block(README.read_text(), block()))
    else:
        sys.stdout.write(block() + "\n")


if __name__ == "__main__":
    main()

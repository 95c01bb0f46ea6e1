"""The README's headline tables: the megakernel against stock vLLM at each point issue #12 names, on an H200, each
point from the newest committed run that measured it, with the issue's target beside it and a link to the run's
folder. The figures and the settings the tables state are read from the committed results, and a CPU test checks
that the README's block is what this module makes of them.

    python -m benchmarks.headline            # print the tables
    python -m benchmarks.headline --write    # replace the README's block between the two markers

Inside vLLM (benchmarks.decode_sweep, both sides in one run): a sweep folder listed later replaces an earlier one at
every (routing, batch, context) whose stock case it measured, whatever its megakernel side did there (a megakernel
case that failed or did not run shows as such, and misses its target). Through the server (benchmarks.serve_load, one
side a call): a level counts from the newest folder holding both sides of it, each side's figures from its own
`side-*.json`; failed requests show as such and miss the target.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.report import changed_env, summarize, tokens_label

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
README = REPO / "README.md"
BEGIN = "<!-- headline: benchmarks/headline.py writes this block; do not edit it by hand -->"
END = "<!-- headline end -->"

# Main's kernel: the session that measured it, and the last commit that changed what the decode step runs (the
# files below). A row measured in another session is marked as an older kernel's. A CPU test fails when a later
# commit changes those files, until both are set again: to the session that measures the new kernel (None until one
# has: then no row is "current"), or, for a change that runs nothing differently (a comment), to the new commit alone.
CURRENT_KERNEL_SESSION: str | None = None
CURRENT_KERNEL_COMMIT = "f6b55ef"  # gemm.cuh's warp count as a template parameter (same SASS); 50e7d5c: batch 3-4 take posted routing and scores
KERNEL_SOURCES = ("csrc", "vllm_megakernel/megakernel/abi.py", "vllm_megakernel/megakernel/layout.py",
                  "vllm_megakernel/megakernel/schedule.py", "vllm_megakernel/megakernel/runtime.py")


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
SERVING_TPOT_LEVELS = range(1, 9)  # issue #12: median TPOT at most 0.7x stock's at concurrency 1 to 8
SERVING_THROUGHPUT_LEVELS = (32, 64)  # and output tok/s no lower than stock's at 32 and 64


def sweep_floor(routing: str, batch: int, context: int) -> float | None:
    """Issue #12's floor for the megakernel / stock tok/s ratio at a point (the uniform-routing grid is "the same
    grid"): batch 1 / 2 / 4 / 8 at 8K at least 1.5 / 1.4 / 1.3 / 1.2x, 16-64 no slower than stock, batch 1 at
    1K, 32K and 128K at least 1.4x."""
    if context == 8192:
        return {1: 1.5, 2: 1.4, 4: 1.3, 8: 1.2}.get(batch, 1.0 if 16 <= batch <= 64 else None)
    if batch == 1 and context in (1024, 32768, 131072):
        return 1.4
    return None


def _link(folder: str, text: str) -> str:
    return f"[{text}](benchmarks/results/{folder})"


def _kernel(session: str) -> str:
    return "current" if session == CURRENT_KERNEL_SESSION else f"session {session}'s"


def _routing(result: dict, folder: str) -> str:
    simulation = result["env"].get("routing_simulation", "off")
    if simulation == "off":
        return "weights"
    if "both sides" in simulation:
        return "uniform"
    # runs before the megakernel simulated routing too: its side routed by the weights, so the sides differ
    raise ValueError(f"{folder}: routing simulated on the stock side only ({simulation}); not a comparison")


# how the settings' row notes name a run's non-default env settings (report.changed_env)
_SETTING_PHRASES = {"sampling": "tokens sampled at {}", "max_model_len": "max_model_len {}"}


def _sweep_settings(result: dict) -> str:
    env = result["env"]
    named = "".join(f", {_SETTING_PHRASES[k].format(v)}" for k, v in changed_env(env).items())
    return (f"{env.get('load_format', '?')} weights, {result['new_tokens']} new tokens{named}, "
            f"median of {env['repeats']} runs")


def sweep_points(sources: Sequence[Source] = SWEEPS, results: Path = RESULTS) -> dict[tuple[str, int, int], dict]:
    """(routing, batch, context) -> the newest row whose stock case ran, with the source it came from and the
    run's settings."""
    points: dict[tuple[str, int, int], dict] = {}
    for src in sources:
        result = json.loads((results / src.folder / "results.json").read_text())
        if "H200" not in result["env"]["gpu"]:
            raise ValueError(f"{src.folder} ran on {result['env']['gpu']}: the headline tables are the H200's")
        if not result["sides"].get("megakernel", {}).get("use_megakernel"):
            raise ValueError(f"{src.folder}: its megakernel side did not run the megakernel")
        routing = _routing(result, src.folder)
        for row in summarize(result):
            if row["stock"] is not None:
                points[(routing, row["batch"], row["context"])] = {**row, "source": src,
                                                                   "settings": _sweep_settings(result)}
    return points


def _sweep_order(key: tuple[str, int, int]) -> tuple:
    routing, batch, context = key
    return routing != "weights", context != 8192, context, batch


def sweep_table(points: dict[tuple[str, int, int], dict]) -> list[str]:
    """The rows of sweep_points, weights' routing first, 8K first, then by context and batch."""
    lines = ["| routing | batch | context | stock tok/s | megakernel tok/s | ratio | issue #12 | megakernel % of SOL | "
             "kernel | run |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(points, key=_sweep_order):
        routing, batch, context = key
        row = points[key]
        floor = sweep_floor(routing, batch, context)
        ratio = row["ratio"]
        verdict = "-" if floor is None else (
            f">= {floor}x: " + ("met" if ratio is not None and ratio >= floor else "**missed**"))
        if ratio is None:
            measured = f"not measured ({row['megakernel_note']}) | - | {verdict} | -"
        else:
            measured = f"{row['megakernel']:.0f} | **{ratio:.3f}x** | {verdict} | {row['megakernel_pct_sol']:.0f}%"
        src = row["source"]
        lines.append(f"| {routing} | {batch} | {tokens_label(context)} | {row['stock']:.0f} | {measured} | "
                     f"{_kernel(src.session)} | {_link(src.folder, src.folder.split('/')[0])} |")
    return lines


def _serving_settings(side_file: dict) -> tuple:
    s = side_file["settings"]
    return s.get("load_format"), s["output_len"], s.get("warmup_wave", False)


def serving_points(sources: Sequence[Source] = SERVING, results: Path = RESULTS) -> dict[tuple[int, int], dict]:
    """(prompt tokens, concurrency) -> each side's row from the newest folder holding both sides of it."""
    points: dict[tuple[int, int], dict] = {}
    for src in sources:
        found: dict[tuple[int, int], dict] = {}
        for path in sorted((results / src.folder).rglob("side-*.json")):
            side_file = json.loads(path.read_text())
            side = path.stem.removeprefix("side-")
            if side == "megakernel" and "runs on the megakernel" not in (side_file.get("decision") or ""):
                raise ValueError(f"{path}: its server did not run the megakernel ({side_file.get('decision')})")
            for row in side_file["rows"]:
                key = (side_file["settings"]["input_len"], row["concurrency"])
                if side in found.setdefault(key, {}):
                    raise ValueError(f"{src.folder}: {side} measured {key} twice; which one counts?")
                found[key][side] = {**row, "folder": path.relative_to(results).parent.as_posix(),
                                    "settings": _serving_settings(side_file)}
        for key, sides in found.items():
            if {"stock", "megakernel"} <= set(sides):
                if sides["stock"]["settings"] != sides["megakernel"]["settings"]:
                    raise ValueError(f"{src.folder}: the two sides of {key} ran with different settings")
                points[key] = {**sides, "source": src}
    return points


def serving_table(points: dict[tuple[int, int], dict]) -> list[str]:
    """The rows of serving_points by prompt length and concurrency; the ratio a level is judged on in bold."""
    lines = ["| prompt | concurrency | median TPOT ms stock / megakernel | TPOT ratio | "
             "output tok/s stock / megakernel | tok/s ratio | issue #12 | kernel | runs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for prompt, conc in sorted(points):
        p = points[(prompt, conc)]
        s, m = p["stock"], p["megakernel"]
        tpot = m["median_tpot_ms"] / s["median_tpot_ms"]
        out = m["output_tok_s"] / s["output_tok_s"]
        tpot_cell, out_cell = f"{tpot:.3f}x", f"{out:.3f}x"
        if conc in SERVING_TPOT_LEVELS:
            verdict = "TPOT <= 0.7x: " + ("met" if tpot <= 0.7 else "**missed**")
            tpot_cell = f"**{tpot_cell}**"
        elif conc in SERVING_THROUGHPUT_LEVELS:
            verdict = "tok/s >= stock: " + ("met" if out >= 1.0 else "**missed**")
            out_cell = f"**{out_cell}**"
        else:
            verdict = "-"
        failed = s["failed"] + m["failed"]
        if failed:
            verdict = f"**missed: {failed} failed requests**" if verdict != "-" else f"{failed} failed requests"
        runs = ", ".join(_link(x["folder"], side) for side, x in (("stock", s), ("megakernel", m)))
        lines.append(f"| {tokens_label(prompt)} | {conc} | {s['median_tpot_ms']:.2f} / {m['median_tpot_ms']:.2f} | "
                     f"{tpot_cell} | {s['output_tok_s']:.0f} / {m['output_tok_s']:.0f} | {out_cell} | {verdict} | "
                     f"{_kernel(p['source'].session)} | {runs} |")
    return lines


def _said(values: set) -> str:
    return "; ".join(sorted(values))


def block() -> str:
    sweeps, serving = sweep_points(), serving_points()
    sweep_settings = {p["settings"] for p in sweeps.values()}
    serving_settings = {f"{load} weights, {out} new tokens" + (", each level after its warm-up wave" if warm else "")
                        for load, out, warm in (p["stock"]["settings"] for p in serving.values())}
    return "\n".join([
        BEGIN,
        f"Inside vLLM (`benchmarks.decode_sweep`, both sides in one run on an H200, vLLM's defaults, "
        f"{_said(sweep_settings)}; SOL at the copy bandwidth measured in the same run). \"current\": main's kernel; a "
        "row from an older session ran an older kernel and stays until the current one is measured at that point.",
        "",
        *sweep_table(sweeps),
        "",
        f"Through the server (`benchmarks.serve_load`, one side a call, each on an H200; {_said(serving_settings)}).",
        "",
        *serving_table(serving),
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

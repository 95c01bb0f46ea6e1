"""One kernel in several processes: does batch 1's level follow where the hardware put the routing blocks?

    python -m benchmarks.ab.processes RUN_DIR ...     # each a kernel_profile or ab.interleaved --out folder

Batch 1's kernel-alone step runs at one of two levels per process (2515 or ~2775 us for one build, every
variant of a process at that process's level; PERF_LOG #93), and the traces put the difference in the
routing chain (router and top-k tasks, then the experts' start). Since ABI 12 every trace record names the
physical SM (%smid) of its block, and kernel_profile keeps the block -> SM map and the routing waves'
physical SMs of one layer. This prints, per process (folder), the batch-1 step, the traced layer, the routing
chain's times, the routing's physical SMs, and how many blocks sit on another physical SM than in the first
folder: if the slow processes are the ones whose routing moved, the placement of blocks on SMs sets the level.
An ab.interleaved folder gives a row per variant (e.g. main against `sm-lists-by-smid`, whose blocks take the
task list of the physical SM they landed on, so its map is the same in every process).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def process_rows(name: str, folder: Path, batch: int = 1) -> list[dict]:
    """The rows of one process's folder at ``batch``: kernel_profile's profile.json gives its default-schedule
    row (named after the folder), benchmarks.ab.interleaved's results.json a row per variant ("folder/variant")."""
    if (folder / "profile.json").exists():
        return [process_row(name, json.loads((folder / "profile.json").read_text()), batch)]
    results = json.loads((folder / "results.json").read_text())["results"]
    profiles = [p for r in results if r["batch"] == batch for p in r["profiles"]]
    if not profiles:
        raise ValueError(f"{name}: no batch {batch} in {folder / 'results.json'}")
    return [process_row(f"{name}/{p['schedule']}", {"results": [{**p, "schedule": "default"}]}, batch)
            for p in profiles]


def process_row(name: str, profile: dict, batch: int = 1) -> dict:
    """The figures of one process's default-schedule row at ``batch`` (a kernel_profile profile.json)."""
    rows = [r for r in profile["results"] if r["batch"] == batch and r["schedule"] == "default"]
    if not rows:
        raise ValueError(f"{name}: no default-schedule row at batch {batch}")
    r = rows[0]
    if "physical_sms" not in r:
        raise ValueError(f"{name}: no physical SMs in its profile (a kernel before ABI 12?)")
    waves = {w["wave"]: w for w in r["waves"]}
    timeline = {w["wave"]: w for w in r["timeline"]["waves"]}
    return {"name": name, "step_us": r["step_us_median"], "layer_us": r["timeline"]["next_layer_us"],
            "router_us": waves["router"]["run_us"], "router_inputs_us": waves["router"]["inputs_us"],
            "topk_us": waves["router_topk"]["run_us"], "experts_start_us": timeline["mlp_up"]["first_run_us"],
            "routing_sms": {k: v for k, v in r["routing_physical_sms"].items() if k != "layer"},
            "physical_sms": list(r["physical_sms"])}


def table(rows: list[dict]) -> str:
    """Markdown: one line per process; 'blocks moved' counts blocks on another physical SM than in the first."""
    first = rows[0]["physical_sms"]
    lines = ["| process | step us | layer us | router task us (inputs) | top-k task us | experts start us | "
             "routing's physical SMs | blocks moved vs the first |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        moved = sum(a != b for a, b in zip(r["physical_sms"], first)) + abs(len(r["physical_sms"]) - len(first))
        sms = "; ".join(f"{w} {v}" for w, v in r["routing_sms"].items())
        lines.append(f"| {r['name']} | {r['step_us']:.0f} | {r['layer_us']:.1f} | {r['router_us']:.1f} "
                     f"({r['router_inputs_us']:.1f}) | {r['topk_us']:.1f} | {r['experts_start_us']:.1f} | {sms} | "
                     f"{moved} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    dirs = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not dirs:
        raise SystemExit("usage: python -m benchmarks.ab.processes RUN_DIR ...")
    rows = [row for d in dirs for row in process_rows(d.name, d)]
    print(table(rows), end="")


if __name__ == "__main__":
    main()

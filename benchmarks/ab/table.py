"""The kernel A/B table: each run's median step time per batch, against the mean of the base's runs.

    python -m benchmarks.ab.table OUT RUN ...     # RUN = NAME-i, a folder OUT/RUN/profile.json; the first NAME is the base

Written by benchmarks/ab/run.sh after its runs; also by hand on runs that came back from the device. Where
kernel_profile could read the SM clock around a batch's timing, the cell ends with the lowest it read.
"""

import json
import sys
from pathlib import Path


def variant(run: str) -> str:
    """A run's variant name: run.sh names the i-th run NAME-i."""
    name, _, index = run.rpartition("-")
    return name if name and index.isdigit() else run


def step_times(profile: dict) -> dict[int, float]:
    """Median step time (us) per batch of one kernel_profile run (its default schedule)."""
    return {r["batch"]: r["step_us_median"] for r in profile["results"] if r["schedule"] == "default"}


def sm_clocks(profile: dict) -> dict[int, int]:
    """The lowest SM clock (MHz) kernel_profile read around each batch's timed launches (its default
    schedule), where it could read one: a run timed at a lowered clock says so in its cell."""
    out = {}
    for r in profile["results"]:
        mhz = [c["sm_mhz"] for c in r.get("clocks") or [] if c]
        if r["schedule"] == "default" and mhz:
            out[r["batch"]] = min(mhz)
    return out


def table(runs: dict[str, dict]) -> str:
    """Markdown: one row per run in the order given; each cell the median step and its change against the
    mean of the base's runs (the base: the first run's variant) at that batch."""
    base = variant(next(iter(runs)))
    steps = {run: step_times(p) for run, p in runs.items()}
    batches = sorted({b for s in steps.values() for b in s})
    ref = {}
    for b in batches:
        own = [s[b] for run, s in steps.items() if variant(run) == base and b in s]
        if own:
            ref[b] = sum(own) / len(own)
    lines = ["| run | copy TB/s | " + " | ".join(f"batch {b}" for b in batches) + " |",
             "|---|---|" + "---|" * len(batches)]
    for run, s in steps.items():
        cells = []
        clocks = sm_clocks(runs[run])
        for b in batches:
            if b not in s:
                cells.append("-")
                continue
            cell = f"{s[b]:.0f} us ({(s[b] / ref[b] - 1) * 100:+.1f}%)" if b in ref else f"{s[b]:.0f} us"
            cells.append(cell + (f" at {clocks[b]} MHz" if b in clocks else ""))
        bw = runs[run]["bandwidth_bytes_per_s"] / 1e12
        lines.append(f"| {run} | {bw:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\nChanges against the mean of the {base} runs at each batch.\n"


def main(argv=None) -> None:
    args = sys.argv[1:] if argv is None else argv
    out, names = Path(args[0]), args[1:]
    runs = {}
    for run in names:
        f = out / run / "profile.json"
        if f.exists():
            runs[run] = json.loads(f.read_text())
        else:
            print(f"{run}: no profile.json (see {out / (run + '.log')})")
    if runs:
        text = table(runs)
        (out / "ab.md").write_text(text)
        print(text)


if __name__ == "__main__":
    main()

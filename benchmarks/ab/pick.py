"""Which candidate of a `benchmarks.ab.interleaved` A/B a device call takes on to its kernel tests.

    python -m benchmarks.ab.pick PRIMARY GUARD CANDIDATE ... [--gain 1.0] [--guard-loss 0.5]

PRIMARY and GUARD are two runs' --out folders (their results.json), e.g. batch 1 and batch 8. A candidate
qualifies when its median change against the base at PRIMARY is at least ``gain`` percent faster and faster than
the A/A control's fastest round there (the run's --control row: the noise a change must beat), and its median
change at GUARD is at most ``guard_loss`` percent slower; of those, the fastest at PRIMARY. Prints its name, or
nothing when none qualifies (or a run is missing: a call cut short picks nothing).
"""

import argparse
import json
from pathlib import Path

CONTROL = "control"  # benchmarks.ab.interleaved's A/A row


def changes(folder: Path) -> dict[str, dict]:
    """Each variant's changes against the base (fractions; interleaved.paired_changes) in a run's first batch;
    empty when the run left no results."""
    path = Path(folder) / "results.json"
    if not path.exists():
        return {}
    results = json.loads(path.read_text())["results"]
    return results[0]["variants"] if results else {}


def pick(primary: dict[str, dict], guard: dict[str, dict], candidates: list[str], gain: float = 1.0,
         guard_loss: float = 0.5) -> str | None:
    """The rule of the module's docstring on two runs' changes (``changes()``); ``gain`` and ``guard_loss`` in %."""
    noise = primary.get(CONTROL, {}).get("change_min", 0.0)  # the A/A row's fastest round against the base
    ok = [c for c in candidates if c in primary and c in guard
          and primary[c]["change"] <= min(-gain / 100, noise) and guard[c]["change"] <= guard_loss / 100]
    return min(ok, key=lambda c: primary[c]["change"]) if ok else None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("primary", type=Path)
    ap.add_argument("guard", type=Path)
    ap.add_argument("candidates", nargs="+")
    ap.add_argument("--gain", type=float, default=1.0, help="percent faster at PRIMARY, at least")
    ap.add_argument("--guard-loss", type=float, default=0.5, help="percent slower at GUARD, at most")
    args = ap.parse_args(argv)
    print(pick(changes(args.primary), changes(args.guard), args.candidates, args.gain, args.guard_loss) or "")


if __name__ == "__main__":
    main()

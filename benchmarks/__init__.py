"""Speed and accuracy harness: the megakernel against stock vLLM, side by side, in one run."""

# The two sides every harness compares, as additional_config for vLLM (the plugin's A/B switch).
SIDE_CONFIG = {"megakernel": {"megakernel": {"enabled": True}}, "stock": {"megakernel": {"enabled": False}}}


def write_text_atomic(path, text: str) -> None:
    """Writes aside and renames into place: a reader (another side's process, or the orchestrator after a
    worker was killed mid-write) sees the old file or the new one, never half of one. The temporary name
    starts with a dot and ends in .tmp, so globs such as lm-eval's *.yaml never pick it up."""
    import os
    from pathlib import Path

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json_atomic(path, obj, indent=None) -> None:
    import json

    write_text_atomic(path, json.dumps(obj, indent=indent))


def parse_sides(ap, text: str) -> list[str]:
    """--sides for the tools whose sides may run in separate invocations: comma-separated, empty for none
    (only re-summarize the output folder); an unknown name is a usage error."""
    sides = [s for s in text.split(",") if s]
    if unknown := set(sides) - set(SIDE_CONFIG):
        ap.error(f"unknown sides {sorted(unknown)}; choose from {list(SIDE_CONFIG)}")
    return sides


def check_same_settings(settings_by_side: dict, what: str) -> None:
    """Sides run apart are only comparable when run with the same settings; a file another run left in the
    output folder is refused rather than compared."""
    import json

    if len({json.dumps(s, sort_keys=True) for s in settings_by_side.values()}) > 1:
        raise ValueError(f"{what} used different settings: {settings_by_side}")

"""Speed and accuracy harness: the megakernel against stock vLLM, side by side, in one run."""

# The two sides every harness compares, as additional_config for vLLM (the plugin's A/B switch).
SIDE_CONFIG = {"megakernel": {"megakernel": {"enabled": True}}, "stock": {"megakernel": {"enabled": False}}}


def write_json_atomic(path, obj, indent=None) -> None:
    """Writes JSON aside and renames it into place: a reader (another side's process, or the orchestrator
    after a worker was killed mid-write) sees the old file or the new one, never half of one."""
    import json
    import os
    from pathlib import Path

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=indent))
    os.replace(tmp, path)

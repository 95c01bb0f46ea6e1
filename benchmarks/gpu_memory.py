"""GPU memory of the device this process sees, read through nvidia-smi (no CUDA context of our own).

nvidia-smi ignores CUDA_VISIBLE_DEVICES, so the device is named by its first entry (an index or a UUID,
both of which `nvidia-smi -i` accepts): on a host with several GPUs the harness then measures and waits
on the GPU its engines actually run on, not on the busiest of all of them.
"""

from __future__ import annotations

import os
import subprocess
import time


def visible_gpu() -> str:
    return (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()


def used_and_total_mib(gpu: str | None = None) -> tuple[int, int]:
    out = subprocess.run(["nvidia-smi", "-i", gpu or visible_gpu(), "--query-gpu=memory.used,memory.total",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10, check=True)
    used, total = (int(x) for x in out.stdout.strip().splitlines()[0].split(","))
    return used, total


def wait_until_released(max_used_fraction: float = 0.05, timeout_s: float = 90.0) -> float:
    """Blocks until the visible GPU's used memory is at most max_used_fraction of it (an engine that just
    exited can hold its memory for a few seconds more, and a new vLLM engine refuses to start while less is
    free than its gpu_memory_utilization asks for); gives up quietly after timeout_s, leaving the engine to
    report what it finds. Returns the used fraction last read (0.0 where nvidia-smi is missing)."""
    deadline = time.time() + timeout_s
    while True:
        try:
            used, total = used_and_total_mib()
        except (OSError, subprocess.SubprocessError, ValueError):
            return 0.0
        if used <= max_used_fraction * total:
            return used / total
        if time.time() > deadline:
            print(f"gpu_memory: GPU {visible_gpu()} still has {used} of {total} MiB in use after {timeout_s:.0f} s; "
                  "going on", flush=True)
            return used / total
        time.sleep(2)

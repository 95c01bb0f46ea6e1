"""The probes in benchmarks/candidates are single CUDA files that a GPU session builds and runs as their headers say;
this keeps each of them compiling for sm_90a (skipped where nvcc is not installed)."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBES = sorted((REPO / "benchmarks" / "candidates").rglob("*.cu"))


def test_there_are_probes_to_compile():
    assert {p.name for p in PROBES} >= {"stage_pace_probe.cu", "tma_slice_probe.cu", "fence_probe.cu"}


@pytest.mark.parametrize("probe", PROBES, ids=[p.stem for p in PROBES])
def test_each_probe_compiles_for_sm_90a(probe, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed on this host")
    proc = subprocess.run([nvcc, "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-O3", "-c", str(probe),
                           "-o", str(tmp_path / f"{probe.stem}.o")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]

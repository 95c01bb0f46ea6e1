"""compute-sanitizer is clean on one megakernel decode step (full width, 5 layers, ragged batch with a
padding row; and a batch of issue #11's ragged lengths up to 128K): no out-of-bounds or misaligned access
(memcheck), no shared-memory hazard (racecheck), no invalid use of a barrier -- named barriers, mbarriers
(synccheck). COMPUTE_SANITIZER names the tool to run
(default: the one on PATH, else the CUDA toolkit's), e.g. a newer release unpacked from PyPI's
nvidia-cuda-sanitizer-api wheel."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


pytestmark = pytest.mark.gpu
HERE = Path(__file__).parent


# Each batch row's history (0: a padding row), the attention splits per request (0: the batch's default) and
# further sanitize_step.py arguments. The ragged case is issue #11's: lengths around a KV block (16) and the
# sliding window (4096), 32K and 128K in one batch with a padding row; its splits are the default's so that no
# task walks 128K alone. The local-routing case runs the expert tasks' producers' own top-k (its cp.async copies
# of the scores and its shared-memory work list) on the first case's batch. Batch 1 to 4's default is posted
# routing with posted scores (layout.posted_routing_for and posted_scores_for): the routers post their scores as
# keys that the top-k polls instead of waiting on their barrier, the top-k posts its work list as words that the
# expert tasks' producers poll; at batch 1 the top-k posts each word as soon as the row's experts are chosen
# (topk::post_one_row), at 2 to 4 after the work list. So the first case runs them at batch 3, and the
# barrier-routing case keeps the top-k's barrier and route buffer (batch 5 and up's form) on the same batch. The
# capped case has the producer wait for its stage two back to land before it claims a buffer
# (StepShape.stages_in_flight; batch 3's default is the whole ring). Batch 1's case runs its default, posted
# scores with the early post; no two cases run the same step (tests/cpu/test_sanitizer_cases.py).
CASES = {"4500-7-pad": ("4500,7,0", 4, []),
         "ragged-to-128k-pad": ("1,15,16,17,4095,4096,4097,32768,131072,0", 0, []),
         "4500-7-pad-local-routing": ("4500,7,0", 4, ["--local-routing"]),
         "4500-7-pad-barrier-routing": ("4500,7,0", 4, ["--barrier-routing"]),
         "4500-batch-1": ("4500", 4, []),
         "4500-7-batch-2": ("4500,7", 4, []),
         "4500-7-pad-2-stages-in-flight": ("4500,7,0", 4, ["--stages-in-flight", "2"])}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_one_step_is_sanitizer_clean(shallow_checkpoint, tool, case):
    sanitizer = (os.environ.get("COMPUTE_SANITIZER") or shutil.which("compute-sanitizer")
                 or "/usr/local/cuda/bin/compute-sanitizer")
    if not Path(sanitizer).exists():
        pytest.skip("compute-sanitizer is not installed on this host")
    lengths, splits, extra = CASES[case]
    proc = subprocess.run([sanitizer, "--tool", tool, "--error-exitcode", "3", sys.executable,
                           str(HERE / "sanitize_step.py"), str(shallow_checkpoint), "--lengths", lengths,
                           "--splits", str(splits), *extra],
                          capture_output=True, text=True, timeout=1200)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert "step ok" in proc.stdout
    # each tool ends with its own summary line
    clean = {"memcheck": "ERROR SUMMARY: 0 errors", "synccheck": "ERROR SUMMARY: 0 errors",
             "racecheck": "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"}[tool]
    assert clean in proc.stdout + proc.stderr, tail

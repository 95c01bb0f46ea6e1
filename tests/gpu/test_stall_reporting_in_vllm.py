"""A megakernel stall inside vLLM's CUDA graphs is reported for whichever batch size's graph ran, not only for
the step Python launched last (every step of the decoder shares one stall record)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.gpu


def test_a_stall_in_a_replayed_batch_8_graph_raises_naming_batch_8s_task(shallow_checkpoint):
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "stall_in_graph.py"), str(shallow_checkpoint)],
                          capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    log = proc.stdout + proc.stderr
    stages = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    # the script prints a line once it has corrupted batch 8's step and one after the generate; without the
    # second it died on the way (its first GPU run, session Z, printed neither line and no log was kept)
    assert [st.get("stage") for st in stages] == ["corrupted", "generated"], (
        f"stall_in_graph.py exited {proc.returncode} after stages {[st.get('stage') for st in stages]}:\n"
        + log[-8000:])
    result = stages[-1]
    assert result["last_launched_batch"] != 8 and 8 in result["built"]  # the case the shared record is for
    # the victim, or a task it holds up that began its wait first (stall_in_graph.py's docstring)
    reported = re.search(r"megakernel stalled in the batch-(\d+) step: task (\d+) \((\w+) layer (\d+)", log)
    assert reported, log[-6000:]
    assert reported.group(1) == "8" and int(reported.group(2)) in result["held_up"], reported.group(0)
    assert result["raised"], "generate returned tokens although batch 8's step stalled"

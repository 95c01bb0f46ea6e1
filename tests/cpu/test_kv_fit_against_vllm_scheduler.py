"""benchmarks.kv_fit against vLLM's own scheduler and KV manager, replayed on the CPU
(tests/cpu/scheduler_replay.py), at the H200 engines' block counts: the largest batch kv_fit lets
through must run whole, all sequences decoding at once, and a few more must not."""

import json
import os
import subprocess
import sys

from conftest import FULL_CONFIG, REPO
from benchmarks.kv_fit import blocks_needed, kv_groups, usable_blocks

BATCHED = 16384  # LLM's max_num_batched_tokens in the H200 engines' logs


def largest_fitting_batch(groups, context: int, blocks: int) -> int:
    b = 0
    while blocks_needed(groups, b + 1, context + 256, BATCHED) <= usable_blocks(blocks):
        b += 1
    return b


def test_the_largest_batch_kv_fit_allows_runs_whole_under_vllms_scheduler_and_little_more_would():
    """At 32K and 256K (the engines of benchmarks/results/h200-2026-11-30-stock-grid) kv_fit's limit is
    vLLM's exactly: 58 and 9. At 8K, vLLM runs 130 and kv_fit allows 128. It counts each sliding group at
    its most blocks, ceil(window / 16) + 1, which an aligned window does not need."""
    config = json.loads((FULL_CONFIG / "config.json").read_text())
    groups = kv_groups(config)
    limits = {(ctx, blocks, max_len): largest_fitting_batch(groups, ctx, blocks)
              for ctx, blocks, max_len in [(32768, 168162, 33040), (261872, 168443, 262144), (8192, 168162, 8464)]}
    assert list(limits.values()) == [58, 9, 128]
    beyond = {32768: 1, 261872: 1, 8192: 3}  # how many more than kv_fit's limit vLLM cannot run whole
    cases = [c for (ctx, blocks, max_len), b in limits.items()
             for c in ([ctx, b, blocks, max_len], [ctx, b + beyond[ctx], blocks, max_len])]
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "cpu" / "scheduler_replay.py"), str(FULL_CONFIG),
                           json.dumps(cases)], capture_output=True, text=True, cwd=REPO, timeout=1200,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    replayed = json.loads(proc.stdout.strip().splitlines()[-1])
    for fits, too_many in zip(replayed[::2], replayed[1::2]):
        assert fits["max_decoding"] == fits["batch"], fits  # the whole batch decoded together
        assert fits["peak_blocks"] <= blocks_needed(groups, fits["batch"], fits["context"] + 256, BATCHED)
        assert too_many["max_decoding"] < too_many["batch"], too_many

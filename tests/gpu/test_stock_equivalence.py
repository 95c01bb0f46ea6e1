"""With the switch off (and while it falls back), the plugin IS stock vLLM: same greedy tokens as vLLM
without the plugin, on the same realistic random weights, through vllm.LLM on the GPU."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.gpu


def greedy(model_dir, additional_config, plugins_on=True, *args):
    """One side of a greedy A/B in a fresh process (benchmarks.greedy); extra CLI args pass through."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    if not plugins_on:
        env["VLLM_PLUGINS"] = ""  # load no general plugin: vLLM exactly as shipped
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.greedy", str(model_dir), json.dumps(additional_config), *args],
        capture_output=True, text=True, timeout=900, env=env, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["log"] = proc.stdout + proc.stderr  # vLLM logs to stdout by default
    return result


def test_switch_off_and_fallback_give_stock_vllm_greedy_tokens(shallow_checkpoint):
    stock = greedy(shallow_checkpoint, {}, plugins_on=False)
    off = greedy(shallow_checkpoint, {"megakernel": {"enabled": False}})
    auto = greedy(shallow_checkpoint, {})
    assert stock["model_class"] == "vllm.model_executor.models.cohere2_moe:Cohere2MoeForCausalLM"
    ours = "vllm_megakernel.models.cohere2_moe:MegakernelCohere2MoeForCausalLM"
    assert off["model_class"] == ours and auto["model_class"] == ours
    assert "vllm_megakernel: decode runs on stock vLLM" in off["log"]
    assert "vllm_megakernel" not in stock["log"]
    # realistic weights: the generations are not degenerate (a constant token would prove little)
    assert all(len(set(t)) > 4 for t in stock["tokens"])
    assert off["tokens"] == stock["tokens"]
    assert auto["tokens"] == stock["tokens"]

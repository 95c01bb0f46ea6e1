import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = REPO / "configs" / "north-mini-code-tiny"
FULL_CONFIG = REPO / "configs" / "north-mini-code"

# vLLM reads these at import; keep test runs quiet, offline and off the V2 runner.
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A realistic random fp32 checkpoint of the tiny config (seed 0)."""
    from vllm_megakernel.tools.make_checkpoint import write_checkpoint

    out = tmp_path_factory.mktemp("tiny-ckpt")
    write_checkpoint(TINY_CONFIG, out, seed=0, dtype="float32")
    return out

import os
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = REPO / "configs" / "north-mini-code-tiny"
FULL_CONFIG = REPO / "configs" / "north-mini-code"
RESULTS = REPO / "benchmarks" / "results"


def committed_results(name: str, keep: Callable[[str], bool]) -> list[Path]:
    """The committed result files called ``name`` (a session folder's subfolders included) whose text ``keep``
    accepts, in path order: the tests that regenerate a committed table from its data run over these."""
    return sorted(p for p in RESULTS.rglob(name) if keep(p.read_text()))


def result_id(path: Path) -> str:
    """A committed result file's test id: its folder under benchmarks/results."""
    return str(path.parent.relative_to(RESULTS))

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


if not has_cuda():
    # vLLM modules bind `current_platform` when they are imported, so the CPU platform has to be in place
    # before any test module imports vLLM's model code; without it vLLM has no device to build layers for.
    import vllm.platforms as _platforms
    from vllm.platforms.cpu import CpuPlatform

    _platforms._current_platform = CpuPlatform()


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


@pytest.fixture(scope="session")
def shallow_checkpoint(tmp_path_factory) -> Path:
    """North Mini Code at full width, first 5 layers (dense+RoPE full layer 0, sliding 1-3, NoPE full 4),
    realistic random bf16 weights (seed 1). With MEGAKERNEL_TEST_CHECKPOINT set, that folder is reused
    when it holds a finished checkpoint and written otherwise, so several pytest processes on one GPU host
    share one 6 GB checkpoint."""
    from vllm_megakernel.tools.make_checkpoint import is_complete, write_checkpoint

    shared = os.environ.get("MEGAKERNEL_TEST_CHECKPOINT")
    out = Path(shared) if shared else tmp_path_factory.mktemp("nmc-5l")
    if not is_complete(out):
        write_checkpoint(FULL_CONFIG, out, seed=1, num_layers=5)
    return out


@pytest.fixture(scope="session")
def vllm_cpu():
    """vLLM on its CPU platform in this process, with a 1-rank gloo group, so that models can be built from
    vLLM's real layers without a GPU. Returns ``build(config_dir, **engine_args) -> (model, vllm_config)``."""
    import tempfile

    if has_cuda():
        pytest.skip("builds models on vLLM's CPU platform; GPU machines run the tests under tests/gpu")
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model

    def build(config_dir, **engine_args):
        engine_args.setdefault("max_model_len", 256)
        engine_args.setdefault("dtype", "float32")
        engine_args.setdefault("load_format", "dummy")
        vllm_config = EngineArgs(model=str(config_dir), **engine_args).create_engine_config()
        with set_current_vllm_config(vllm_config):
            if not model_parallel_is_initialized():
                init_distributed_environment(
                    world_size=1, rank=0, local_rank=0, backend="gloo",
                    distributed_init_method=f"file://{tempfile.mktemp()}",
                )
                initialize_model_parallel(1, 1)
            model = initialize_model(vllm_config=vllm_config)
        return model, vllm_config

    return build

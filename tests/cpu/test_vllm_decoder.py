"""Which batches the megakernel takes inside vLLM, judged from vLLM's attention metadata."""

from types import SimpleNamespace

from conftest import FULL_CONFIG, TINY_CONFIG
from vllm_megakernel.megakernel.vllm_decoder import is_pure_decode, unsupported_model_reasons


def md(max_query_len=1, use_cascade=False):
    return SimpleNamespace(max_query_len=max_query_len, use_cascade=use_cascade)


def test_pure_decode_needs_one_query_token_everywhere_and_no_cascade():
    assert is_pure_decode({"a": md(), "b": md()})
    assert not is_pure_decode({"a": md(), "b": md(max_query_len=7)})  # a prefill or mixed batch
    assert not is_pure_decode({"a": md(use_cascade=True)})
    assert not is_pure_decode(None)  # profiling and dummy runs
    assert not is_pure_decode({})
    assert not is_pure_decode([{"a": md()}])  # dual-batch overlap hands a list


def test_north_mini_code_fits_the_kernel_and_the_tiny_config_does_not():
    from transformers import AutoConfig

    assert unsupported_model_reasons(AutoConfig.from_pretrained(FULL_CONFIG)) == []
    reasons = unsupported_model_reasons(AutoConfig.from_pretrained(TINY_CONFIG))
    assert any("hidden=64" in r for r in reasons)


def test_shared_workspace_fits_every_batch_up_to_its_size_and_refuses_larger():
    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel import runtime

    from vllm_megakernel.megakernel import layout

    dims = ref.ModelDims.from_config(FULL_CONFIG)
    steps = [(b, layout.attn_splits_for(b, 132)) for b in range(1, 65)]
    ws = runtime.allocate_workspace(dims, steps, 768, 3072, device="meta")
    nbytes = sum(t.numel() * t.element_size() for t in ws.values())
    assert nbytes < 1 << 30  # DESIGN: the megakernel's own buffers stay under 1 GiB at batch 64
    small = runtime.allocate_workspace(dims, steps[16:17], 768, 3072, device="meta")
    assert all(small[k].numel() <= ws[k].numel() for k in ws)
    big = runtime.allocate_workspace(dims, [(65, 3)], 768, 3072, device="meta")
    assert any(big[k].numel() > ws[k].numel() for k in ws)
    assert all(t.device.type == "meta" for t in ws.values())  # sizes only: nothing was allocated


def test_batch_limit_never_exceeds_the_largest_cuda_graph():
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CUDAGraphMode

    from vllm_megakernel.megakernel.vllm_decoder import MAX_BATCH, batch_limit

    graphs = CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE, max_cudagraph_capture_size=16)
    assert batch_limit(graphs) == 16
    big = CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY, max_cudagraph_capture_size=512)
    assert batch_limit(big) == MAX_BATCH
    eager = CompilationConfig(cudagraph_mode=CUDAGraphMode.NONE, max_cudagraph_capture_size=16)
    assert batch_limit(eager) == MAX_BATCH  # no graphs: every decode batch runs eagerly anyway

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


def _recording_cache(gate=None, fail=()):
    """A ScheduleCache whose builds record (batch, thread) and return a stand-in schedule; batch 64's build waits
    on ``gate`` when given, and sizes in ``fail`` raise."""
    import threading

    from vllm_megakernel.megakernel.vllm_decoder import ScheduleCache

    calls = []

    class Built:
        def __init__(self, batch):
            self.batch = batch

        def encode(self):
            return ("encoded", self.batch)

    def build(batch):
        calls.append((batch, threading.current_thread().name))
        if gate is not None and batch == 64:
            assert gate.wait(10)
        if batch in fail:
            raise ValueError(f"no schedule for batch {batch}")
        return Built(batch)

    return ScheduleCache(build), calls


def test_capture_sizes_are_built_once_on_a_background_thread_largest_first():
    import threading

    cache, calls = _recording_cache()
    cache.prebuild([1, 8, 64, 8])
    for thread in threading.enumerate():  # let it finish, so that no get() below takes a size over
        if thread.name == "vllm_megakernel-schedules":
            thread.join(10)
    for b in (64, 8, 1):
        sched, encoded = cache.get(b)
        assert sched.batch == b and encoded == ("encoded", b)
    assert cache.get(64)[0] is cache.get(64)[0]  # kept: vLLM's rebuild after its profiling capture reuses it
    assert calls == [(64, "vllm_megakernel-schedules"), (8, "vllm_megakernel-schedules"),
                     (1, "vllm_megakernel-schedules")]
    cache.get(3)  # a size nobody asked for ahead (an eager decode batch): built by the caller
    assert calls[-1][0] == 3 and calls[-1][1] != "vllm_megakernel-schedules"


def test_a_size_the_thread_has_not_reached_is_built_by_its_caller_and_a_failed_build_raises_there():
    import threading

    import pytest

    gate = threading.Event()  # holds the background thread inside its first build (64)
    cache, calls = _recording_cache(gate, fail=(2,))
    cache.prebuild([64, 16, 2])
    for _ in range(10_000):
        if calls:
            break
        threading.Event().wait(0.001)
    sched, _ = cache.get(16)  # queued behind 64: built here rather than after it
    assert sched.batch == 16 and calls[-1] == (16, threading.current_thread().name)
    gate.set()
    assert cache.get(64)[0].batch == 64
    with pytest.raises(ValueError, match="no schedule for batch 2"):
        cache.get(2)
    assert sorted(b for b, _ in calls) == [2, 16, 64]  # every size built once


def test_prebuilt_sizes_are_the_full_decode_graphs_up_to_the_batch_limit():
    from vllm.config.compilation import CUDAGraphMode

    from vllm_megakernel.megakernel.vllm_decoder import prebuilt_batches

    sizes = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 128]
    cc = lambda mode: SimpleNamespace(cudagraph_mode=mode, cudagraph_capture_sizes=sizes)  # noqa: E731
    seqs = SimpleNamespace(max_num_seqs=64)
    assert prebuilt_batches(cc(CUDAGraphMode.FULL_AND_PIECEWISE), seqs, 64) == sizes[:11]
    assert prebuilt_batches(cc(CUDAGraphMode.FULL_DECODE_ONLY), SimpleNamespace(max_num_seqs=8), 64) == [1, 2, 4, 8]
    assert prebuilt_batches(cc(CUDAGraphMode.FULL_AND_PIECEWISE), seqs, 16) == [1, 2, 4, 8, 16]
    assert prebuilt_batches(cc(CUDAGraphMode.PIECEWISE), seqs, 64) == []  # decode runs eagerly, at its own sizes
    assert prebuilt_batches(cc(CUDAGraphMode.NONE), seqs, 64) == []

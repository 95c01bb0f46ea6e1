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
    assert any("hidden_size=64" in r for r in reasons)

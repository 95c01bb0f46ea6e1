"""The tiny model built from vLLM's own layers (CPU platform): our class, the weight names and layouts the
megakernel will read in place, per-layer sliding windows, and the switch applied at construction."""

import pytest
import torch

from conftest import TINY_CONFIG
from vllm_megakernel import reference as ref
from vllm_megakernel.models.cohere2_moe import MegakernelCohere2MoeForCausalLM
from vllm_megakernel.options import MegakernelOptionError, MegakernelUnavailableError


def load_checkpoint(model, ckpt_dir):
    from safetensors.torch import load_file

    def weights():
        for f in sorted(ckpt_dir.glob("*.safetensors")):
            yield from load_file(str(f)).items()

    return model.load_weights(weights())


@pytest.fixture(scope="module")
def loaded(vllm_cpu, tiny_checkpoint):
    model, vllm_config = vllm_cpu(TINY_CONFIG)
    loaded_names = load_checkpoint(model, tiny_checkpoint)
    return model, vllm_config, loaded_names


def test_model_is_our_subclass_and_falls_back_on_cpu(loaded):
    model, _, _ = loaded
    assert type(model) is MegakernelCohere2MoeForCausalLM
    assert not model.megakernel_decision.use_megakernel
    assert model.megakernel_decision.reasons  # says why


def test_decision_is_logged_through_vllms_logger(vllm_cpu):
    """vLLM configures only its own logger tree; the one decision line must reach its handler."""
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    vllm_root = logging.getLogger("vllm")
    vllm_root.addHandler(handler)
    try:
        vllm_cpu(TINY_CONFIG, additional_config={"megakernel": {"enabled": False}})
    finally:
        vllm_root.removeHandler(handler)
    lines = [r.getMessage() for r in records if r.getMessage().startswith("vllm_megakernel:")]
    assert lines == ["vllm_megakernel: decode runs on stock vLLM: "
                     "disabled by additional_config.megakernel.enabled=false"]
    assert records[[r.getMessage() for r in records].index(lines[0])].levelno == logging.INFO


def test_every_parameter_is_loaded_from_the_checkpoint(loaded):
    model, _, loaded_names = loaded
    assert set(dict(model.named_parameters())) == set(loaded_names)


def test_vllm_weight_layouts(loaded, tiny_checkpoint):
    """qkv_proj rows are q;k;v, w13 is [E, 2I, H] with gate rows first, w2 is [E, H, I], o_proj [H, Hq*D]."""
    from safetensors.torch import load_file

    model, _, _ = loaded
    dims = ref.ModelDims.from_config(TINY_CONFIG)
    sd = {}
    for f in tiny_checkpoint.glob("*.safetensors"):
        sd.update(load_file(str(f)))
    params = dict(model.named_parameters())
    d, hq, hkv, h = dims.head_dim, dims.num_heads, dims.num_kv_heads, dims.hidden
    a = "model.layers.1.self_attn"
    qkv = params[f"{a}.qkv_proj.weight"]
    assert qkv.shape == ((hq + 2 * hkv) * d, h)
    assert torch.equal(qkv[: hq * d], sd[f"{a}.q_proj.weight"])
    assert torch.equal(qkv[hq * d : (hq + hkv) * d], sd[f"{a}.k_proj.weight"])
    assert torch.equal(qkv[(hq + hkv) * d :], sd[f"{a}.v_proj.weight"])
    assert params[f"{a}.o_proj.weight"].shape == (h, hq * d)
    e = "model.layers.1.mlp"
    w13 = params[f"{e}.experts.routed_experts.w13_weight"]
    w2 = params[f"{e}.experts.routed_experts.w2_weight"]
    inter = 32
    assert w13.shape == (dims.num_experts, 2 * inter, h) and w13.is_contiguous()
    assert w2.shape == (dims.num_experts, h, inter) and w2.is_contiguous()
    x = dims.num_experts - 1
    assert torch.equal(w13[x, :inter], sd[f"{e}.experts.{x}.gate_proj.weight"])
    assert torch.equal(w13[x, inter:], sd[f"{e}.experts.{x}.up_proj.weight"])
    assert torch.equal(w2[x], sd[f"{e}.experts.{x}.down_proj.weight"])
    dense = params["model.layers.0.mlp.gate_up_proj.weight"]
    assert torch.equal(dense[:96], sd["model.layers.0.mlp.gate_proj.weight"])


def test_reference_reads_vllm_parameters_in_place(loaded, tiny_checkpoint):
    model, _, _ = loaded
    dims = ref.ModelDims.from_config(TINY_CONFIG)
    in_place = ref.Weights.from_vllm_model(model)
    from_ckpt = ref.Weights.from_checkpoint(tiny_checkpoint, dims)
    params = {p.data_ptr() for p in model.parameters()}
    for lw_vllm, lw_ckpt in zip(in_place.layers, from_ckpt.layers):
        for field in ("norm", "qkv", "o", "gate_up", "down", "router", "w13", "w2"):
            a, b = getattr(lw_vllm, field), getattr(lw_ckpt, field)
            assert (a is None) == (b is None), field
            if a is not None:
                assert a.data_ptr() in params, f"{field} is a copy, not vLLM's parameter"
                assert torch.equal(a, b), field
    assert torch.equal(in_place.embed, from_ckpt.embed)


def test_attention_layers_carry_the_config_sliding_window(loaded):
    model, _, _ = loaded
    dims = ref.ModelDims.from_config(TINY_CONFIG)
    windows = [layer.self_attn.attn.sliding_window for layer in model.model.layers]
    assert windows == [dims.sliding_window if s else None for s in dims.sliding]
    assert [bool(layer.self_attn.sliding_window or layer.self_attn.force_rope) for layer in model.model.layers] \
        == list(dims.rope)


def test_explicit_enable_on_an_unsupported_setup_falls_back_or_raises_with_strict(vllm_cpu):
    from vllm_megakernel.options import MegakernelUnsupportedError

    model, _ = vllm_cpu(TINY_CONFIG, additional_config={"megakernel": {"enabled": True}})
    assert not model.megakernel_decision.use_megakernel and model.megakernel is None
    assert any("not CUDA" in r for r in model.megakernel_decision.reasons)
    with pytest.raises(MegakernelUnsupportedError, match="not CUDA"):
        vllm_cpu(TINY_CONFIG, additional_config={"megakernel": {"enabled": True, "strict": True}})


def test_unknown_option_key_fails_at_construction(vllm_cpu):
    with pytest.raises(MegakernelOptionError, match="unknown key"):
        vllm_cpu(TINY_CONFIG, additional_config={"megakernel": {"enabeld": True}})


def test_disabled_switch_builds_stock_model(vllm_cpu):
    model, _ = vllm_cpu(TINY_CONFIG, additional_config={"megakernel": {"enabled": False}})
    assert model.megakernel_decision.reasons == ("disabled by additional_config.megakernel.enabled=false",)


def test_without_the_extension_the_model_still_builds_on_stock(vllm_cpu, monkeypatch):
    """A pure-Python install (no nvcc at build time): the import of _C fails, automatic mode serves stock."""
    import sys

    import vllm_megakernel
    from vllm_megakernel import extension

    extension.load.cache_clear()
    # Together these make `from vllm_megakernel import _C` fail as it does when nothing was compiled.
    monkeypatch.setitem(sys.modules, "vllm_megakernel._C", None)
    monkeypatch.delattr(vllm_megakernel, "_C", raising=False)
    try:
        module, problem = extension.load()
        assert module is None and "is not built" in problem and "pip install" in problem
        model, _ = vllm_cpu(TINY_CONFIG)
        assert not model.megakernel_decision.use_megakernel
        assert "is not built" in model.megakernel_decision.reasons[0]
        with pytest.raises(MegakernelUnavailableError, match="is not built"):
            vllm_cpu(TINY_CONFIG, additional_config={"megakernel": {"enabled": True}})
    finally:
        extension.load.cache_clear()


def test_an_extension_of_another_abi_is_refused_with_a_rebuild_hint(vllm_cpu, monkeypatch):
    """A stale build (another ABI version) reads the step tables at other offsets: extension.load() names the
    mismatch, automatic mode serves stock, `enabled: true` raises, and runtime.launch refuses it before any
    launch."""
    import sys
    import types

    import vllm_megakernel
    from vllm_megakernel import extension
    from vllm_megakernel.megakernel import abi, runtime

    launched = []
    stale = types.ModuleType("vllm_megakernel._C")
    stale.build_info = lambda: {"decode_kernel": True, "abi_version": abi.ABI_VERSION - 1}
    stale.launch_decode = lambda **kw: launched.append(kw)
    extension.load.cache_clear()
    monkeypatch.setitem(sys.modules, "vllm_megakernel._C", stale)
    monkeypatch.setattr(vllm_megakernel, "_C", stale, raising=False)
    try:
        module, problem = extension.load()
        assert module is stale and f"ABI {abi.ABI_VERSION - 1}" in problem and "rebuild" in problem
        model, _ = vllm_cpu(TINY_CONFIG)
        assert not model.megakernel_decision.use_megakernel
        with pytest.raises(MegakernelUnavailableError, match="rebuild"):
            vllm_cpu(TINY_CONFIG, additional_config={"megakernel": {"enabled": True}})
        with pytest.raises(ValueError, match=f"for ABI {abi.ABI_VERSION - 1}"):
            runtime.launch(types.SimpleNamespace(unsupported=[]))
        assert not launched
        current = types.ModuleType("current")
        current.build_info = lambda: {"decode_kernel": True, "abi_version": abi.ABI_VERSION}
        assert extension.abi_mismatch(current) is None
    finally:
        extension.load.cache_clear()

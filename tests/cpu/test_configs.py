"""configs/north-mini-code is North Mini Code exactly (DESIGN.md section 1), as vLLM and transformers parse it;
the tokenizer serves text and carries the special tokens vLLM's cohere_command parsers look up."""

import pytest

from conftest import FULL_CONFIG, TINY_CONFIG


@pytest.fixture(scope="module")
def hf_config():
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(FULL_CONFIG)


def test_full_config_values(hf_config):
    c = hf_config
    assert c.architectures == ["Cohere2MoeForCausalLM"] and c.model_type == "cohere2_moe"
    assert (c.hidden_size, c.num_hidden_layers, c.vocab_size) == (2048, 49, 262144)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (32, 4, 128)
    assert (c.num_experts, c.num_experts_per_tok, c.intermediate_size) == (128, 8, 768)
    assert c.prefix_dense_intermediate_size == 3072
    assert c.expert_selection_fn == "sigmoid" and c.norm_topk_prob is False
    assert c.num_shared_experts == 0
    assert c.rms_norm_eps == 1e-6 and c.logit_scale == 1.0 and c.tie_word_embeddings
    assert c.rope_parameters["rope_theta"] == 50000.0
    assert c.sliding_window == 4096 and c.eos_token_id == 255001


def test_full_config_layer_pattern(hf_config):
    from vllm_megakernel.reference import ModelDims

    full = [i for i, t in enumerate(hf_config.layer_types) if t == "full_attention"]
    assert full == list(range(0, 49, 4))  # 13 layers: 0, 4, ..., 48
    assert hf_config.mlp_layer_types == ["dense"] + ["sparse"] * 48
    dims = ModelDims.from_config(hf_config)
    # RoPE on the 36 sliding layers and on layer 0; none on full layers 4..48.
    assert [i for i in range(49) if dims.rope[i]] == [0] + [i for i in range(49) if i % 4]


def test_full_config_parameter_count(hf_config):
    """30.5 B total, 3.3 B active per token (DESIGN.md section 1), from the shapes the checkpoint tool writes."""
    import math

    from vllm_megakernel.tools.make_checkpoint import tensor_specs

    cfg = hf_config.to_dict()
    total = sum(math.prod(shape) for _, shape, _ in tensor_specs(cfg))
    expert = 3 * cfg["hidden_size"] * cfg["intermediate_size"]
    active = total - 48 * (cfg["num_experts"] - cfg["num_experts_per_tok"]) * expert
    assert 30.4e9 < total < 30.6e9
    assert 3.25e9 < active < 3.35e9


def test_vllm_engine_config_keeps_per_layer_sliding_window():
    """layer_types makes vLLM treat the model as interleaved: no global sliding window in the cache config."""
    import subprocess
    import sys
    import textwrap

    code = f"""
        import vllm.platforms as p
        from vllm.platforms.cpu import CpuPlatform
        p._current_platform = CpuPlatform()
        from vllm.engine.arg_utils import EngineArgs
        vc = EngineArgs(model="{FULL_CONFIG}", load_format="dummy", max_model_len=8192).create_engine_config()
        print(vc.model_config.architecture, vc.cache_config.sliding_window, vc.model_config.get_sliding_window())
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=600, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    arch, cache_window, model_window = proc.stdout.split()[-3:]
    assert arch == "Cohere2MoeForCausalLM" and cache_window == "None" and model_window == "4096"


@pytest.mark.parametrize("config_dir", [FULL_CONFIG, TINY_CONFIG])
def test_tokenizer_round_trips_text_and_has_command_special_tokens(config_dir):
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(config_dir)
    cfg = AutoConfig.from_pretrained(config_dir)
    assert len(tok) == cfg.vocab_size
    text = "def f(x):\n    return x * 2  # ünïcødé ✓"
    ids = tok(text)["input_ids"]
    assert ids[0] == cfg.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.eos_token_id == cfg.eos_token_id
    for t in ["<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>", "<|END_ACTION|>",
              "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>"]:
        tid = tok.convert_tokens_to_ids(t)
        assert tid != tok.unk_token_id and tok.decode([tid]) == t
    # every id decodes (sampled ids beyond the byte range must not break detokenisation)
    assert tok.decode([cfg.vocab_size - 1]).startswith("<unused_")


def test_chat_template_renders_turns_and_tool_calls():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(FULL_CONFIG)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Be brief.")
    assert '"name": "add"' in text
    assert ('<|START_ACTION|>[{"tool_call_id": "c1", "tool_name": "add", "parameters": {"a": 1, "b": 2}}]'
            '<|END_ACTION|>') in text
    assert '<|START_TOOL_RESULT|>[{"tool_call_id": "c1", "results": {"0": "3"}}]<|END_TOOL_RESULT|>' in text
    assert text.endswith("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")


@pytest.mark.parametrize("config_dir", [FULL_CONFIG, TINY_CONFIG])
def test_config_declares_a_transformers_5_version(config_dir):
    """transformers 5.17 (the GPU image's) treats a local config.json without transformers_version as a
    possible Mistral tokenizer and warns that tokenization is wrong; a 5.x version skips that check."""
    import json

    from packaging.version import Version

    assert Version(json.loads((config_dir / "config.json").read_text())["transformers_version"]) >= Version("5")

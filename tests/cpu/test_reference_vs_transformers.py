"""The reference decode step is the megakernel's oracle, so it is checked against an independent model:
transformers' Cohere2MoeForCausalLM on the same checkpoint (fp32, CPU, eager attention)."""

import pytest
import torch

from conftest import TINY_CONFIG
from vllm_megakernel import reference as ref
from vllm_megakernel.paged_kv import PagedKVSim

# fp32 on both sides, same weights; the two differ only in summation order.
ATOL = 2e-5
RTOL = 1e-4


@pytest.fixture(scope="module")
def hf_model(tiny_checkpoint):
    from transformers import Cohere2MoeForCausalLM

    model = Cohere2MoeForCausalLM.from_pretrained(
        tiny_checkpoint, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


@pytest.fixture(scope="module")
def dims():
    return ref.ModelDims.from_config(TINY_CONFIG)


@pytest.fixture(scope="module")
def weights(tiny_checkpoint, dims):
    return ref.Weights.from_checkpoint(tiny_checkpoint, dims, dtype=torch.float32)


def test_tiny_config_has_every_feature_the_reference_models(dims):
    assert dims.dense[0] and not dims.sliding[0] and dims.rope[0]  # dense prefix: full attention + RoPE
    nope_full = [i for i in range(dims.num_layers) if not dims.sliding[i] and not dims.rope[i]]
    assert nope_full, "needs a full-attention layer without RoPE"
    assert all(dims.rope[i] for i in range(dims.num_layers) if dims.sliding[i])
    assert dims.num_experts >= 16 and dims.top_k >= 4 and not dims.norm_topk_prob
    assert dims.num_heads > dims.num_kv_heads
    assert dims.num_heads * dims.head_dim > dims.hidden


def test_weights_from_checkpoint_match_transformers_parameters(hf_model, weights, dims):
    sd = hf_model.state_dict()
    moe_layer = next(i for i in range(dims.num_layers) if not dims.dense[i])
    p = f"model.layers.{moe_layer}.mlp"
    torch.testing.assert_close(weights.layers[moe_layer].w13, sd[f"{p}.experts.gate_up_proj"], rtol=0, atol=0)
    torch.testing.assert_close(weights.layers[moe_layer].w2, sd[f"{p}.experts.down_proj"], rtol=0, atol=0)
    torch.testing.assert_close(weights.layers[moe_layer].router, sd[f"{p}.gate.weight"], rtol=0, atol=0)
    assert hf_model.lm_head.weight.data_ptr() == hf_model.model.embed_tokens.weight.data_ptr()


def run_reference(dims, weights, prompts, num_new, block_size, seed):
    """Feeds each prompt token by token, then greedily generates num_new tokens; all requests share each
    step (ragged lengths), plus one padding row. Returns per request (tokens, [logits per position])."""
    max_len = max(len(p) for p in prompts) + num_new
    sim = PagedKVSim(dims, num_requests=len(prompts) + 1, max_len=max_len, block_size=block_size, seed=seed)
    seqs = [list(p) for p in prompts]
    out_logits = [[] for _ in prompts]
    targets = [len(p) + num_new for p in prompts]
    fed = [0] * len(prompts)
    while any(f < t for f, t in zip(fed, targets)):
        tokens = []
        for r, seq in enumerate(seqs):
            tokens.append(seq[fed[r]] if fed[r] < targets[r] else None)
        tokens.append(None)  # a padding row, as in vLLM's padded CUDA-graph batches
        inp = sim.step(tokens)
        hidden = ref.decode_step(dims, weights, inp)
        assert torch.isfinite(hidden).all(), "the reference read memory that nothing wrote (NaN)"
        assert (hidden[-1] == 0).all()
        lg = ref.logits(dims, weights, hidden)
        for r in range(len(prompts)):
            if tokens[r] is None:
                continue
            out_logits[r].append(lg[r])
            fed[r] += 1
            if fed[r] == len(seqs[r]) and len(seqs[r]) < targets[r]:
                seqs[r].append(int(lg[r].argmax()))  # greedy
    return seqs, out_logits


@pytest.mark.parametrize("block_size", [4, 16])
def test_reference_decode_matches_transformers_logits(hf_model, dims, weights, block_size):
    window = dims.sliding_window
    gen = torch.Generator().manual_seed(1234 + block_size)
    # Below, at, and well above the sliding window, in one batch.
    lengths = [3, window, 2 * window + 5]
    prompts = [torch.randint(0, dims.vocab, (n,), generator=gen).tolist() for n in lengths]
    seqs, ref_logits = run_reference(dims, weights, prompts, num_new=6, block_size=block_size, seed=block_size)
    for seq, lg in zip(seqs, ref_logits):
        with torch.no_grad():
            hf = hf_model(torch.tensor([seq])).logits[0].float()
        ours = torch.stack(lg)
        assert ours.shape == hf.shape
        torch.testing.assert_close(ours, hf, atol=ATOL, rtol=RTOL)
        assert torch.equal(ours.argmax(-1), hf.argmax(-1))


def test_reference_fails_loudly_if_window_is_ignored(dims, weights, hf_model):
    """The comparison can fail: treating sliding layers as full attention changes the logits."""
    import dataclasses

    full_dims = dataclasses.replace(dims, sliding_window=None)
    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, dims.vocab, (3 * dims.sliding_window,), generator=gen).tolist()
    _, lg = run_reference(full_dims, weights, [prompt], num_new=0, block_size=4, seed=0)
    with torch.no_grad():
        hf = hf_model(torch.tensor([prompt])).logits[0].float()
    assert (torch.stack(lg[0]) - hf).abs().max() > 100 * ATOL


def test_weights_report_their_ffn_widths_and_move_whole(weights):
    assert weights.intermediates() == (32, 96)  # the tiny config's expert and dense-prefix widths
    moved = weights.to("meta")
    assert moved.embed.device.type == "meta" and moved.layers[0].router is None
    assert all(t.device.type == "meta" for t in (moved.layers[1].w13, moved.layers[1].w2, moved.final_norm))


def test_weights_without_a_moe_layer_are_refused_by_name_not_with_a_stopiteration(weights):
    dense_only = ref.Weights(weights.embed, weights.final_norm, weights.layers[:1])
    with pytest.raises(ValueError, match="no MoE layer"):
        dense_only.intermediates()


def test_near_tie_rule_accepts_only_choices_within_tolerance_of_the_kth_score():
    scores = torch.tensor([0.90, 0.80, 0.700, 0.695, 0.60])  # k = 3: the k-th best is 0.700
    assert ref.is_near_tie(scores, torch.tensor([0, 1, 3]), 3)  # 0.695 is 0.005 below it
    assert not ref.is_near_tie(scores, torch.tensor([0, 1, 4]), 3)  # 0.60 is 0.1 below it
    assert ref.is_near_tie(scores, torch.tensor([0, 1, 4]), 3, tol=0.2)


def test_vector_distance_is_cosine_and_max_error_relative_to_the_expected_max_per_vector():
    import torch

    from vllm_megakernel.reference import vector_distance

    expected = torch.tensor([[[1.0, -2.0, 4.0], [0.5, 0.5, 0.5]]])  # [rows, vectors, values]
    got = expected.clone()
    got[0, 0, 1] = -1.0  # off by 1 against a max of 4: 25%
    cos, err = vector_distance(got, expected)
    assert cos.shape == err.shape == (1, 2)
    assert err[0, 0].item() == 0.25 and err[0, 1].item() == 0.0
    assert cos[0, 1].item() > 0.9999999 and cos[0, 0].item() < 0.99
    assert vector_distance(2 * expected, expected)[0].min().item() > 0.9999  # cosine ignores scale, error does not
    assert vector_distance(2 * expected, expected)[1].max().item() == 1.0

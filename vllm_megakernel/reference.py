"""Pure-PyTorch oracle of ONE North Mini Code decode step on vLLM's layouts.

Given what vLLM hands the model on a decode step -- one token per request, its position, each request's
sequence length (including the new token), one paged KV cache per layer in the FlashAttention layout
``(num_blocks, 2, block_size, num_kv_heads, head_dim)`` and, per KV-cache group of the hybrid manager, a
block table and a slot mapping -- it returns the final hidden states (after the final RMSNorm; vLLM's
``compute_logits`` takes it from there) and writes the new K/V exactly where vLLM would.

The model (DESIGN.md section 1): parallel block ``x + attn(norm(x)) + mlp(norm(x))`` with one RMSNorm per
layer; interleaved (GPT-J) RoPE on sliding layers and on the dense prefix layer, none on the other full
layers; sliding window W means a query at position p sees keys p-W+1..p; dense SwiGLU prefix, then MoE with
sigmoid routing, top-k, weights renormalised only if ``norm_topk_prob``; tied embeddings.

Padding rows (``seq_len == 0``, slot ``-1``) write nothing, read nothing and return zeros. Weights are read
in place: :meth:`Weights.from_vllm_model` takes views of vLLM's parameters, and
:meth:`Weights.from_hf_state_dict` builds the same layout from a checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class ModelDims:
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    num_experts: int
    top_k: int
    norm_topk_prob: bool
    eps: float
    rope_theta: float
    sliding_window: int | None
    sliding: tuple[bool, ...]  # per layer: sliding-window attention
    rope: tuple[bool, ...]  # per layer: RoPE applied
    dense: tuple[bool, ...]  # per layer: dense SwiGLU (else MoE)
    logit_scale: float

    @classmethod
    def from_config(cls, config: Any) -> ModelDims:
        """From a transformers ``Cohere2MoeConfig``, a config dict, or a path to a config.json / its dir."""
        if isinstance(config, (str, Path)):
            path = Path(config)
            config = json.loads((path / "config.json" if path.is_dir() else path).read_text())
        if isinstance(config, Mapping):
            from transformers import Cohere2MoeConfig

            config = Cohere2MoeConfig(**{k: v for k, v in config.items() if k != "architectures"})
        if getattr(config, "expert_selection_fn", "sigmoid") != "sigmoid":
            raise ValueError("North Mini Code routes with sigmoid; this reference implements only that")
        if getattr(config, "rms_norm_eps", None) is None:
            raise ValueError("North Mini Code uses RMSNorm (rms_norm_eps); LayerNorm configs are not modelled")
        if getattr(config, "num_shared_experts", 0):
            raise ValueError("shared experts are not part of North Mini Code")
        n = config.num_hidden_layers
        sliding = tuple(t == "sliding_attention" for t in config.layer_types)
        dense = tuple(t == "dense" for t in config.mlp_layer_types)
        # The dense prefix keeps RoPE when prefix_dense_sliding_window_pattern == 1 (vLLM and transformers).
        force = [dense[i] and config.prefix_dense_sliding_window_pattern == 1 for i in range(n)]
        rope = tuple(sliding[i] or force[i] for i in range(n))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            hidden=config.hidden_size,
            num_layers=n,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            vocab=config.vocab_size,
            num_experts=config.num_experts,
            top_k=config.num_experts_per_tok,
            norm_topk_prob=bool(config.norm_topk_prob),
            eps=float(config.rms_norm_eps),
            rope_theta=float(config.rope_parameters["rope_theta"]),
            sliding_window=config.sliding_window,
            sliding=sliding,
            rope=rope,
            dense=dense,
            logit_scale=float(config.logit_scale),
        )


def layer_shapes(dims: ModelDims, moe_intermediate: int, dense_intermediate: int,
                 layer: int) -> dict[str, tuple[int, ...]]:
    """One layer's weights in vLLM's layout (:class:`LayerWeights` field -> shape), the one place they are
    written: :meth:`Weights.random` makes them, :func:`hf_tensor_specs` splits them into a checkpoint's
    tensors (which :meth:`Weights.from_hf_state_dict` joins back), ``benchmarks.sol`` counts their bytes."""
    h, d, e = dims.hidden, dims.head_dim, dims.num_experts
    shapes = {"norm": (h,), "qkv": ((dims.num_heads + 2 * dims.num_kv_heads) * d, h), "o": (h, dims.num_heads * d)}
    if dims.dense[layer]:
        shapes.update(gate_up=(2 * dense_intermediate, h), down=(h, dense_intermediate))
    else:
        shapes.update(router=(e, h), w13=(e, 2 * moe_intermediate, h), w2=(e, h, moe_intermediate))
    return shapes


def model_shapes(dims: ModelDims) -> dict[str, tuple[int, ...]]:
    """The weights outside the layers: the (tied) embedding and the final norm."""
    return {"embed": (dims.vocab, dims.hidden), "final_norm": (dims.hidden,)}


def hf_tensor_specs(dims: ModelDims, moe_intermediate: int, dense_intermediate: int):
    """Yields (name, shape, is_norm) of every tensor of a Hugging Face checkpoint (per-expert keys), in the
    order a checkpoint lists them: :func:`layer_shapes` split the way :meth:`Weights.from_hf_state_dict`
    joins them back."""
    q, kv = dims.num_heads * dims.head_dim, dims.num_kv_heads * dims.head_dim
    top = model_shapes(dims)
    yield "model.embed_tokens.weight", top["embed"], False
    for layer in range(dims.num_layers):
        p, s = f"model.layers.{layer}", layer_shapes(dims, moe_intermediate, dense_intermediate, layer)
        h = s["qkv"][1]
        yield f"{p}.input_layernorm.weight", s["norm"], True
        yield f"{p}.self_attn.q_proj.weight", (q, h), False
        yield f"{p}.self_attn.k_proj.weight", (kv, h), False
        yield f"{p}.self_attn.v_proj.weight", (kv, h), False
        yield f"{p}.self_attn.o_proj.weight", s["o"], False
        if dims.dense[layer]:
            i = s["gate_up"][0] // 2
            yield f"{p}.mlp.gate_proj.weight", (i, h), False
            yield f"{p}.mlp.up_proj.weight", (i, h), False
            yield f"{p}.mlp.down_proj.weight", s["down"], False
        else:
            e, i2, _ = s["w13"]
            yield f"{p}.mlp.gate.weight", s["router"], False
            for x in range(e):
                yield f"{p}.mlp.experts.{x}.gate_proj.weight", (i2 // 2, h), False
                yield f"{p}.mlp.experts.{x}.up_proj.weight", (i2 // 2, h), False
                yield f"{p}.mlp.experts.{x}.down_proj.weight", s["w2"][1:], False
    yield "model.norm.weight", top["final_norm"], True


@dataclasses.dataclass
class LayerWeights:
    norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(Hq + 2 Hkv) D, H], rows q;k;v
    o: torch.Tensor  # [H, Hq D]
    # dense prefix layer
    gate_up: torch.Tensor | None = None  # [2I, H], gate rows then up rows
    down: torch.Tensor | None = None  # [H, I]
    # MoE layer
    router: torch.Tensor | None = None  # [E, H]
    w13: torch.Tensor | None = None  # [E, 2I, H], gate rows then up rows
    w2: torch.Tensor | None = None  # [E, H, I]


@dataclasses.dataclass
class Weights:
    embed: torch.Tensor  # [V, H]; tied LM head
    final_norm: torch.Tensor  # [H]
    layers: list[LayerWeights]

    def intermediates(self) -> tuple[int, int]:
        """(expert FFN width, dense-prefix FFN width or 0), read off the weights' shapes. The schedule builder
        sizes the expert tiles from the first, so a model without a MoE layer (a checkpoint cut to its dense
        first layer) is refused here, by name."""
        moe_i = next((lw.w2.shape[2] for lw in self.layers if lw.w2 is not None), None)
        if moe_i is None:
            raise ValueError(f"the weights hold no MoE layer ({len(self.layers)} layers, all dense): the megakernel's "
                             "schedule needs at least one (cut a checkpoint to 2 layers or more)")
        dense_i = next((lw.down.shape[1] for lw in self.layers if lw.down is not None), 0)
        return moe_i, dense_i

    def to(self, device) -> Weights:
        """A copy on ``device`` (tests move checkpoint weights to the GPU with it)."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        layers = [LayerWeights(**{f.name: move(getattr(lw, f.name)) for f in dataclasses.fields(lw)})
                  for lw in self.layers]
        return Weights(move(self.embed), move(self.final_norm), layers)

    @classmethod
    def from_vllm_model(cls, model: torch.nn.Module) -> Weights:
        """Views of a vLLM ``Cohere2MoeForCausalLM``'s parameters (Triton MoE layout), no copies."""
        params = dict(model.named_parameters())
        layers = []
        for i, layer in enumerate(model.model.layers):
            p = f"model.layers.{i}"
            lw = LayerWeights(
                norm=params[f"{p}.input_layernorm.weight"],
                qkv=params[f"{p}.self_attn.qkv_proj.weight"],
                o=params[f"{p}.self_attn.o_proj.weight"],
            )
            if f"{p}.mlp.gate_up_proj.weight" in params:
                lw.gate_up = params[f"{p}.mlp.gate_up_proj.weight"]
                lw.down = params[f"{p}.mlp.down_proj.weight"]
            else:
                lw.router = params[f"{p}.mlp.gate.weight"]
                experts = layer.mlp.experts
                lw.w13 = _find_param(experts, "w13_weight")
                lw.w2 = _find_param(experts, "w2_weight")
            layers.append(lw)
        return cls(params["model.embed_tokens.weight"], params["model.norm.weight"], layers)

    @classmethod
    def from_hf_state_dict(cls, sd: Mapping[str, torch.Tensor], dims: ModelDims,
                           dtype: torch.dtype | None = None) -> Weights:
        """Builds vLLM's layout from HF names (per-expert or fused ``experts.gate_up_proj`` keys)."""

        def get(name: str) -> torch.Tensor:
            t = sd[name]
            return t.to(dtype) if dtype is not None else t

        layers = []
        for i in range(dims.num_layers):
            p = f"model.layers.{i}"
            a = f"{p}.self_attn"
            lw = LayerWeights(
                norm=get(f"{p}.input_layernorm.weight"),
                qkv=torch.cat([get(f"{a}.q_proj.weight"), get(f"{a}.k_proj.weight"),
                               get(f"{a}.v_proj.weight")]),
                o=get(f"{a}.o_proj.weight"),
            )
            if dims.dense[i]:
                lw.gate_up = torch.cat([get(f"{p}.mlp.gate_proj.weight"), get(f"{p}.mlp.up_proj.weight")])
                lw.down = get(f"{p}.mlp.down_proj.weight")
            else:
                lw.router = get(f"{p}.mlp.gate.weight")
                if f"{p}.mlp.experts.gate_up_proj" in sd:
                    lw.w13 = get(f"{p}.mlp.experts.gate_up_proj")
                    lw.w2 = get(f"{p}.mlp.experts.down_proj")
                else:
                    e = f"{p}.mlp.experts"
                    lw.w13 = torch.stack([
                        torch.cat([get(f"{e}.{x}.gate_proj.weight"), get(f"{e}.{x}.up_proj.weight")])
                        for x in range(dims.num_experts)
                    ])
                    lw.w2 = torch.stack([get(f"{e}.{x}.down_proj.weight") for x in range(dims.num_experts)])
            layers.append(lw)
        return cls(get("model.embed_tokens.weight"), get("model.norm.weight"), layers)

    @classmethod
    def random(cls, dims: ModelDims, moe_intermediate: int, dense_intermediate: int, device,
               dtype: torch.dtype = torch.bfloat16, std: float = 0.02, seed: int = 0) -> Weights:
        """Realistic random weights made directly on ``device`` in vLLM's layout: matrices ~ N(0, std),
        norms 1 (the make_checkpoint recipe without the files; for timing the whole model on one GPU)."""
        gen = torch.Generator(device=device).manual_seed(seed)

        def make(name, shape):
            if name in ("norm", "final_norm"):
                return torch.ones(shape, dtype=dtype, device=device)
            return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std).to(dtype)

        layers = [LayerWeights(**{name: make(name, shape) for name, shape in
                                  layer_shapes(dims, moe_intermediate, dense_intermediate, i).items()})
                  for i in range(dims.num_layers)]
        top = {name: make(name, shape) for name, shape in model_shapes(dims).items()}
        return cls(top["embed"], top["final_norm"], layers)

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, dims: ModelDims, dtype: torch.dtype | None = None) -> Weights:
        from safetensors.torch import load_file

        sd: dict[str, torch.Tensor] = {}
        for f in sorted(Path(ckpt_dir).glob("*.safetensors")):
            sd.update(load_file(str(f)))
        return cls.from_hf_state_dict(sd, dims, dtype)


def _find_param(module: torch.nn.Module, suffix: str) -> torch.Tensor:
    for name, p in module.named_parameters():
        if name.split(".")[-1] == suffix:
            return p
    raise KeyError(f"no parameter named *{suffix} under {type(module).__name__}")


@dataclasses.dataclass
class KVGroup:
    """One KV-cache group of vLLM's hybrid manager: its block table and this step's slot mapping."""

    block_table: torch.Tensor  # [B, max_blocks] int32; blocks out of a sliding window may be 0 (null)
    slot_mapping: torch.Tensor  # [B] int64; block * block_size + offset, -1 for padding rows


@dataclasses.dataclass
class DecodeInputs:
    input_ids: torch.Tensor  # [B]
    positions: torch.Tensor  # [B]; position of the new token (= seq_len - 1 for live rows)
    seq_lens: torch.Tensor  # [B]; tokens in the sequence including the new one, 0 for padding
    kv_caches: Sequence[torch.Tensor]  # per layer (num_blocks, 2, block_size, Hkv, D), K at index 0
    layer_group: Sequence[int]  # per layer: index into groups
    groups: Sequence[KVGroup]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * xf).to(x.dtype)


def rope_interleaved(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """GPT-J RoPE on [B, heads, D]: pairs (x[2i], x[2i+1]) turn by position * theta^(-2i/D)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [B, D/2]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    xf = x.float()
    even, odd = xf[..., 0::2], xf[..., 1::2]
    out = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
    return out.to(x.dtype)


def write_kv(cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    block_size = cache.shape[2]
    for b, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        cache[slot // block_size, 0, slot % block_size] = k[b]
        cache[slot // block_size, 1, slot % block_size] = v[b]


def attend(q: torch.Tensor, cache: torch.Tensor, block_table: torch.Tensor, seq_len: int,
           window: int | None, num_kv_heads: int) -> torch.Tensor:
    """One request's attention: q [Hq, D] over its cached keys in the window; returns [Hq, D]."""
    block_size = cache.shape[2]
    start = 0 if window is None else max(0, seq_len - window)
    pos = torch.arange(start, seq_len, device=q.device)
    blocks = block_table[pos // block_size].long()
    offs = pos % block_size
    k = cache[blocks, 0, offs].float()  # [T, Hkv, D]
    v = cache[blocks, 1, offs].float()
    group = q.shape[0] // num_kv_heads
    qf = q.float().view(num_kv_heads, group, -1)  # query head h uses kv head h // group
    scores = torch.einsum("kgd,tkd->kgt", qf, k) * q.shape[-1] ** -0.5
    probs = scores.softmax(-1)
    out = torch.einsum("kgt,tkd->kgd", probs, v)
    return out.reshape(q.shape).to(q.dtype)


def route(h: torch.Tensor, router: torch.Tensor, dims: ModelDims
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sigmoid top-k routing: (weights fp32 [B, K], experts [B, K], all scores fp32 [B, E]).

    Router logits are rounded to the activation dtype (vLLM's gate is a linear layer in that dtype), so
    exact ties between experts happen; they go to the lower expert id (a stable sort), which the kernel
    does too. ``torch.topk`` leaves tie order unspecified.
    """
    scores = (h @ router.t()).float().sigmoid()
    weights, experts = torch.sort(scores, dim=-1, descending=True, stable=True)
    weights, experts = weights[:, : dims.top_k], experts[:, : dims.top_k]
    if dims.norm_topk_prob:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, experts, scores


# Sigmoid-score distance from the k-th best at which two correct bf16 implementations may route differently
# (about 2 bf16 ulps of a router logit).
ROUTER_TIE_TOL = 0.01


# The kernel step's tolerance against this reference, per vector (vector_distance): different summation orders
# in bf16 (tests/gpu/test_megakernel_step.py; benchmarks.ab.interleaved's check of another schedule).
STEP_MIN_COSINE = 0.999
STEP_MAX_REL_ERR = 0.03


def vector_distance(got: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per vector (the last dimension) of ``got`` against ``expected``: cosine similarity, and max absolute error
    relative to the expected vector's max magnitude -- the measures every kernel-against-reference check here
    states its tolerance in (STEP_MIN_COSINE, STEP_MAX_REL_ERR)."""
    got, expected = got.float(), expected.float()
    cos = F.cosine_similarity(got, expected, dim=-1)
    return cos, (got - expected).abs().amax(-1) / expected.abs().amax(-1)


def is_near_tie(scores: torch.Tensor, chosen: torch.Tensor, top_k: int, tol: float = ROUTER_TIE_TOL) -> bool:
    """Whether another implementation's choice ``chosen`` (expert ids) for one row is a near-tie in this
    row's own ``scores`` [E]: every chosen expert scores within ``tol`` of the k-th best."""
    scores = scores.float().cpu()
    kth = scores.sort(descending=True).values[top_k - 1]
    return bool(scores[chosen.long().cpu()].min() >= kth - tol)


def _fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finalizer (csrc/ops/router.cuh has the same)."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def uniform_draw(layer: int, position: int, row: int, j: int, num_experts: int) -> int:
    """The j-th uniform draw of batch row ``row`` at ``position`` on ``layer`` (csrc/ops/router.cuh:
    uniform_draw). The row is part of the key: rows at one position (equal prompts) draw apart."""
    x = ((layer * 0x9E3779B1) ^ ((position & 0xFFFFFFFF) * 0x85EBCA77) ^ (j * 0xC2B2AE3D)
         ^ (row * 0x27D4EB2F)) & 0xFFFFFFFF
    return _fmix32(x) % num_experts


def uniform_experts(layer: int, positions: torch.Tensor, top_k: int, num_experts: int) -> torch.Tensor:
    """Experts [B, K] drawn uniformly at random for simulated routing: the first ``top_k`` distinct values
    of the draws j = 0, 1, ... (a hash of layer, the row's position, the row and j), so that the kernel, the
    simulator and this reference draw the same ones and every step draws new ones. Distinct like a real
    top-k, so an expert's rows never outnumber the batch. vLLM's ``uniform_random`` simulation draws with
    torch.randint, repeats allowed, so its stock side reads slightly fewer distinct experts per layer than
    this (at batch 8, 50.5 against 51.6 of 128 in expectation): the comparison leans against the megakernel."""
    out = torch.empty(positions.shape[0], top_k, dtype=torch.long)
    for b, pos in enumerate(positions.tolist()):
        chosen: list[int] = []
        j = 0
        while len(chosen) < top_k:
            e = uniform_draw(layer, pos, b, j, num_experts)
            if e not in chosen:
                chosen.append(e)
            j += 1
        out[b] = torch.tensor(chosen)
    return out.to(positions.device)


def moe(h: torch.Tensor, lw: LayerWeights, dims: ModelDims, forced: torch.Tensor | None = None,
        record: list | None = None, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """The routed experts. ``forced`` [B, K] replaces the top-k choice (weights are still this layer's
    sigmoid scores of those experts), so another implementation's routing can be replayed; ``uniform``
    [B, K] replaces it with weight 1 each (simulated uniform routing); ``record`` receives this layer's
    scores [B, E] and choice."""
    weights, experts, scores = route(h, lw.router, dims)
    if record is not None:
        record.append((scores, experts))
    if uniform is not None:
        experts = uniform.long()
        weights = torch.ones(experts.shape, dtype=torch.float32, device=h.device)
    elif forced is not None:
        experts = forced.long()
        weights = scores.gather(1, experts)
        if dims.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
    inter = lw.w2.shape[-1]
    for b in range(h.shape[0]):
        for w, e in zip(weights[b].tolist(), experts[b].tolist()):
            gu = h[b] @ lw.w13[e].t()
            act = F.silu(gu[:inter]) * gu[inter:]
            out[b] += w * (act @ lw.w2[e].t()).float()
    return out.to(h.dtype)


def dense_mlp(h: torch.Tensor, lw: LayerWeights) -> torch.Tensor:
    gu = h @ lw.gate_up.t()
    inter = lw.down.shape[-1]
    return (F.silu(gu[:, :inter]) * gu[:, inter:]) @ lw.down.t()


@torch.no_grad()
def decode_step(dims: ModelDims, weights: Weights, inp: DecodeInputs,
                forced_experts: torch.Tensor | None = None, routing: dict | None = None,
                uniform_routing: bool = False) -> torch.Tensor:
    """Final hidden states [B, H] for one decode step; writes each live row's new K/V into the caches.

    ``forced_experts`` [num_layers, B, K] replays another implementation's expert choice on MoE layers
    (see :func:`moe`); ``routing``, a dict, receives {layer: (scores [B, E], own choice [B, K])};
    ``uniform_routing`` draws the experts with :func:`uniform_experts` instead.
    """
    live = inp.seq_lens > 0
    x = weights.embed[inp.input_ids.long()]
    d, hq, hkv = dims.head_dim, dims.num_heads, dims.num_kv_heads
    for i, lw in enumerate(weights.layers):
        h = rms_norm(x, lw.norm, dims.eps)
        qkv = h @ lw.qkv.t()
        q = qkv[:, : hq * d].view(-1, hq, d)
        k = qkv[:, hq * d : (hq + hkv) * d].view(-1, hkv, d)
        v = qkv[:, (hq + hkv) * d :].view(-1, hkv, d)
        if dims.rope[i]:
            q = rope_interleaved(q, inp.positions, dims.rope_theta)
            k = rope_interleaved(k, inp.positions, dims.rope_theta)
        group = inp.groups[inp.layer_group[i]]
        cache = inp.kv_caches[i]
        write_kv(cache, group.slot_mapping, k, v)
        window = dims.sliding_window if dims.sliding[i] else None
        attn = torch.zeros_like(q)
        for b in range(q.shape[0]):
            if live[b]:
                attn[b] = attend(q[b], cache, group.block_table[b], int(inp.seq_lens[b]), window, hkv)
        attn_out = attn.reshape(q.shape[0], hq * d) @ lw.o.t()
        if dims.dense[i]:
            mlp_out = dense_mlp(h, lw)
        else:
            rec = [] if routing is not None else None
            uniform = uniform_experts(i, inp.positions, dims.top_k, dims.num_experts) if uniform_routing else None
            mlp_out = moe(h, lw, dims, None if forced_experts is None else forced_experts[i], rec, uniform)
            if rec:
                routing[i] = rec[0]
        x = x + attn_out + mlp_out
    out = rms_norm(x, weights.final_norm, dims.eps)
    return torch.where(live[:, None], out, torch.zeros_like(out))


def logits(dims: ModelDims, weights: Weights, hidden: torch.Tensor) -> torch.Tensor:
    """The tied LM head, as vLLM's LogitsProcessor applies it (scale included)."""
    return (hidden @ weights.embed.t()).float() * dims.logit_scale

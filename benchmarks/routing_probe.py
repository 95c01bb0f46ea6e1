"""Measured routing: how many distinct experts a decode step at batch B actually runs, per MoE layer.

Speed of light at batch B depends on it (each distinct expert's weights are read once per step). The probe
runs the reference decode step on the model's own weights (read in place) for a few steps of B random
requests over a synthetic KV history and averages, over MoE layers and steps, the number of distinct
experts the live rows chose. Uniform routing would give E * (1 - (1 - k/E)^B); correlated routing less.
"""

from __future__ import annotations

import torch

from vllm_megakernel import reference as ref
from vllm_megakernel.paged_kv import PagedKVSim


def distinct_experts(dims: ref.ModelDims, weights: ref.Weights, batch: int, steps: int = 2, context: int = 64,
                     seed: int = 0) -> float:
    dev, dt = weights.embed.device, weights.embed.dtype
    gen = torch.Generator().manual_seed(seed)
    sim = PagedKVSim(dims, num_requests=batch, max_len=context + steps + 1, block_size=16, dtype=dt,
                     device=dev, seed=seed)
    sim.fill_history([context] * batch, generator=gen, scale=0.1)
    counts = []
    for _ in range(steps):
        tokens = torch.randint(0, dims.vocab, (batch,), generator=gen).tolist()
        routing: dict = {}
        ref.decode_step(dims, weights, sim.step(tokens), routing=routing)
        counts += [len(set(choice.flatten().tolist())) for _, choice in routing.values()]
    return sum(counts) / len(counts)


def probe_vllm_model(model, batch: int, steps: int = 2) -> float:
    """For ``LLM.apply_model``: the probe on a loaded vLLM Cohere2Moe model's weights."""
    dims = ref.ModelDims.from_config(model.config)
    return distinct_experts(dims, ref.Weights.from_vllm_model(model), batch, steps)

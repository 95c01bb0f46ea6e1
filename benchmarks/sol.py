"""Speed of light for a North Mini Code decode step, from the config (nothing hard-coded).

bytes(step) = always-read weights (attention, router, dense prefix, norms, and the tied LM head that
vLLM's compute_logits streams every step) + distinct experts actually run x bytes per expert, summed over
MoE layers + KV read (per request: every cached token on full-attention layers, at most the window on
sliding layers). At batch 1 every chosen expert is distinct; at batch B with uniform routing the expected
number of distinct experts per layer is E * (1 - (1 - k/E)^B). Time = bytes / measured HBM bandwidth.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class ModelBytes:
    always: int  # bytes read every step whatever the routing (LM head included)
    per_expert: int  # bytes of one expert (gate, up, down)
    moe_layers: int
    num_experts: int
    top_k: int
    kv_per_token_full: int  # K+V bytes of one token, summed over full-attention layers
    kv_per_token_sliding: int  # same over sliding layers
    sliding_window: int | None

    @classmethod
    def from_config(cls, config: dict, dtype_bytes: int = 2) -> ModelBytes:
        from vllm_megakernel.reference import ModelDims, layer_shapes, model_shapes

        dims = ModelDims.from_config(config)
        i_moe = config["intermediate_size"]
        i_dense = config.get("prefix_dense_intermediate_size") or i_moe
        numel = lambda shape: math.prod(shape)  # noqa: E731
        # the LM head is the tied embedding (the lookup itself reads only the batch's rows) + final norm
        always = sum(numel(s) for s in model_shapes(dims).values())
        per_expert = 0
        for layer in range(dims.num_layers):
            for name, shape in layer_shapes(dims, i_moe, i_dense, layer).items():
                if name in ("w13", "w2"):  # streamed only for the experts a step chose
                    per_expert += numel(shape) // dims.num_experts
                else:
                    always += numel(shape)
        moe_layers = sum(1 for x in dims.dense if not x)
        kv_token = 2 * dims.num_kv_heads * dims.head_dim  # K and V of one token in one layer
        full = sum(1 for s in dims.sliding if not s)
        return cls(
            always=always * dtype_bytes,
            per_expert=per_expert // max(moe_layers, 1) * dtype_bytes,
            moe_layers=moe_layers,
            num_experts=dims.num_experts,
            top_k=dims.top_k,
            kv_per_token_full=kv_token * full * dtype_bytes,
            kv_per_token_sliding=kv_token * (dims.num_layers - full) * dtype_bytes,
            sliding_window=dims.sliding_window,
        )

    def kv_bytes(self, context: int) -> int:
        sliding_tokens = context if self.sliding_window is None else min(context, self.sliding_window)
        return context * self.kv_per_token_full + sliding_tokens * self.kv_per_token_sliding

    def step_bytes(self, contexts: Sequence[int], distinct_experts_per_layer: float) -> float:
        return (self.always + self.moe_layers * distinct_experts_per_layer * self.per_expert
                + sum(self.kv_bytes(c) for c in contexts))


def expected_distinct_experts(num_experts: int, top_k: int, batch: int) -> float:
    """E[#experts chosen by at least one of `batch` tokens], each token choosing top_k of num_experts
    uniformly without replacement: a given expert is missed by one token with probability 1 - k/E."""
    if batch <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** batch)


def expected_distinct_experts_with_replacement(num_experts: int, top_k: int, batch: int) -> float:
    """The same when each token draws its top_k experts independently, repeats allowed, as vLLM's uniform
    routing simulator does (torch.randint): an expert is missed by each of the batch x top_k draws with
    probability 1 - 1/E."""
    if batch <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - 1.0 / num_experts) ** (top_k * batch))


def sol_tokens_per_s(mb: ModelBytes, batch: int, context: int, bandwidth_bytes_per_s: float,
                     distinct_experts: float | None = None) -> float:
    """Aggregate decode tok/s at the memory speed of light for `batch` requests of `context` tokens."""
    if distinct_experts is None:
        distinct_experts = expected_distinct_experts(mb.num_experts, mb.top_k, batch)
    seconds = mb.step_bytes([context] * batch, distinct_experts) / bandwidth_bytes_per_s
    return batch / seconds


def cuda_times(fn, iters: int, warmup: int = 2) -> list[float]:
    """Seconds each of ``iters`` calls of ``fn`` takes on the current CUDA stream (events around each call),
    after ``warmup`` untimed calls."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def measure_bandwidth(nbytes: int = 8 << 30, iters: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written (median)."""
    import torch

    n = nbytes // 2  # each of src and dst holds half, so a copy moves nbytes in all
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    times = sorted(cuda_times(lambda: dst.copy_(src), iters))
    # The decode sweep measures this first and then starts vLLM engines in other processes, which refuse to
    # start when free memory is under their utilization: on an 80 GB H100 the 8 GB kept in this process's cache
    # left 70.15 of 79.18 GiB free against 0.9's 71.26 GiB (session AK). Hand it back.
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / times[len(times) // 2]


__all__ = ["ModelBytes", "cuda_times", "expected_distinct_experts", "measure_bandwidth",
           "sol_tokens_per_s"]

"""Whether B sequences of a given length can all run in vLLM's KV cache at once, counted the way vLLM's
hybrid KV-cache manager allocates blocks.

vLLM splits a model with full-attention and sliding-window layers into KV-cache groups with the same
number of layers each (for North Mini Code: 13 full layers as one group, 36 sliding layers as three). The
groups share one pool of blocks, and every group holds its own blocks for every running request:
- a full-attention group keeps the whole sequence: ceil(length / block) blocks;
- a sliding-window group frees what falls out of the window, so while decoding it holds the last
  `window` tokens, at most ceil(window / block) + 1 blocks. While a request is admitted and prefilled,
  the group holds up to vLLM's admission cap instead (SlidingWindowSpec.max_admission_blocks_per_request):
  ceil((window - 1 + max_num_batched_tokens) / block) + 1 blocks.
So "tokens of KV cache" = blocks x block size overstates what fits. The whole batch runs at once when B
sequences at their decode holding, plus the admission surplus of the last one admitted, fit the pool less
its null block. The grouping is vLLM's own `get_kv_cache_groups`, applied to the config's layer types.
"""

from __future__ import annotations

import dataclasses
import statistics
import types


@dataclasses.dataclass(frozen=True)
class KVGroup:
    window: int | None  # None: keeps every token (full attention, or any group with the hybrid manager off)
    block_size: int

    def decode_blocks(self, length: int) -> int:
        """Blocks this group holds for one decoding sequence of `length` tokens."""
        whole = -(-length // self.block_size)
        return whole if self.window is None else min(whole, -(-self.window // self.block_size) + 1)

    def admission_blocks(self, length: int, max_num_batched_tokens: int) -> int:
        """Blocks it holds for that sequence while it is admitted and prefilled."""
        whole = -(-length // self.block_size)
        if self.window is None:
            return whole
        return min(whole, -(-(self.window - 1 + max_num_batched_tokens) // self.block_size) + 1)


def layer_specs(config: dict, block_size: int = 16, dtype=None) -> dict:
    """vLLM KV-cache specs of every attention layer, from the config's layer types."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    from vllm_megakernel.reference import ModelDims

    dims = ModelDims.from_config(config)
    common = dict(block_size=block_size, num_kv_heads=dims.num_kv_heads, head_size=dims.head_dim,
                  dtype=dtype or torch.bfloat16)
    return {f"model.layers.{i}.self_attn.attn":
            SlidingWindowSpec(sliding_window=dims.sliding_window, **common) if sliding else FullAttentionSpec(**common)
            for i, sliding in enumerate(dims.sliding)}


def kv_groups(config: dict, block_size: int = 16, vllm_config=None) -> list[KVGroup]:
    """The model's KV-cache groups as vLLM forms them (its own grouping function, on the config's layers)."""
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    if vllm_config is None:  # only the hybrid-manager switch is read; vLLM's default leaves it on
        vllm_config = types.SimpleNamespace(
            scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False))
    groups = get_kv_cache_groups(vllm_config, layer_specs(config, block_size))
    # With the hybrid manager off, vLLM merges every layer into one FullAttentionSpec group that still
    # carries the window but keeps every token: only a SlidingWindowSpec group frees what leaves its window.
    return [KVGroup(window=g.kv_cache_spec.sliding_window if isinstance(g.kv_cache_spec, SlidingWindowSpec) else None,
                    block_size=g.kv_cache_spec.block_size) for g in groups]


def blocks_needed(groups: list[KVGroup], batch: int, length: int, max_num_batched_tokens: int) -> int:
    """Blocks `batch` sequences of `length` tokens need to run at once: all at their decode holding, and the
    last one admitted at its admission holding."""
    decode = sum(g.decode_blocks(length) for g in groups)
    surplus = sum(g.admission_blocks(length, max_num_batched_tokens) - g.decode_blocks(length) for g in groups)
    return batch * decode + surplus


def case_blocks_needed(groups: list[KVGroup], batch: int, context: int, new_tokens: int,
                       max_num_batched_tokens: int) -> int:
    """blocks_needed for a decode-sweep case: a timed run of new_tokens + 1 stores the K/V of context +
    new_tokens tokens (the last sampled token has none)."""
    return blocks_needed(groups, batch, context + new_tokens, max_num_batched_tokens)


def usable_blocks(num_gpu_blocks: int) -> int:
    return num_gpu_blocks - 1  # vLLM's block pool keeps block 0 as the null block


def describe(groups: list[KVGroup]) -> str:
    full = sum(1 for g in groups if g.window is None)
    sliding = sorted({g.window for g in groups if g.window is not None})
    return f"{full} full-attention group(s)" + (f" + {len(groups) - full} sliding-window group(s) (window "
                                                 f"{', '.join(map(str, sliding))})" if sliding else "")


def mark_cases_that_do_not_fit(result: dict, max_num_batched_tokens: int, block_size: int = 16) -> dict:
    """A decode-sweep result from before this check (its cases record kv_capacity_tokens = blocks x block
    size), with every measured case whose batch could not run at once marked as not fitting; its measured
    figure stays in the reason. Cases that already carry kv_blocks_needed were checked when measured."""
    groups = kv_groups(result["config"], block_size)
    cases = []
    for c in result["cases"]:
        if c["status"] == "ok" and "kv_blocks_needed" not in c:
            blocks = c["kv_capacity_tokens"] // block_size
            need = case_blocks_needed(groups, c["batch"], c["context"], result["new_tokens"], max_num_batched_tokens)
            if need > usable_blocks(blocks):
                rate = statistics.median(c["per_request_tok_s"]) * c["batch"]
                c = {k: v for k, v in c.items() if k != "per_request_tok_s"}
                c.update(status="skipped", kv_blocks=blocks, kv_blocks_needed=need,
                         reason=f"does not fit the KV cache: needs {need} blocks, the engine had {blocks}; "
                                f"measured before this check as {rate:.0f} tok/s, which is no batch-{c['batch']} "
                                "rate")
        cases.append(c)
    return {**result, "cases": cases}


__all__ = ["KVGroup", "blocks_needed", "case_blocks_needed", "describe", "kv_groups", "layer_specs",
           "mark_cases_that_do_not_fit", "usable_blocks"]

"""Whether B sequences of a given length can all sit in vLLM's KV cache at once, counted the way vLLM's
hybrid KV-cache manager allocates blocks.

vLLM splits a model with full-attention and sliding-window layers into KV-cache groups with the same
number of layers each (for North Mini Code: 13 full layers as one group, 36 sliding layers as three). The
groups share one pool of blocks, and every group holds its own blocks for every running request:
- a full-attention group keeps the whole sequence: ceil(length / block) blocks;
- a sliding-window group frees what falls out of the window while the request runs, so during decode it
  holds the last `window` tokens, which span at most ceil(window / block) + 1 blocks.
So "tokens of KV cache" = blocks x block size overstates what fits: each token of a sequence takes one
slot in the full group, and the sliding groups take theirs on top. The grouping comes from vLLM's own
`get_kv_cache_groups`, applied to the layer types in the model's config, and the engine's block count
from `cache_config.num_gpu_blocks`.
"""

from __future__ import annotations

import dataclasses
import types


@dataclasses.dataclass(frozen=True)
class KVGroup:
    window: int | None  # None: full attention (keeps every token)
    block_size: int

    def blocks(self, length: int) -> int:
        """Blocks this group holds for one running sequence of `length` tokens."""
        whole = -(-length // self.block_size)
        if self.window is None:
            return whole
        return min(whole, -(-self.window // self.block_size) + 1)


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

    if vllm_config is None:  # only the hybrid-manager switch is read; vLLM's default leaves it on
        vllm_config = types.SimpleNamespace(
            scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False))
    groups = get_kv_cache_groups(vllm_config, layer_specs(config, block_size))
    return [KVGroup(window=getattr(g.kv_cache_spec, "sliding_window", None), block_size=g.kv_cache_spec.block_size)
            for g in groups]


def blocks_needed(groups: list[KVGroup], batch: int, length: int) -> int:
    """Blocks `batch` running sequences of `length` tokens hold at once."""
    return batch * sum(g.blocks(length) for g in groups)


def describe(groups: list[KVGroup]) -> str:
    full = sum(1 for g in groups if g.window is None)
    sliding = sorted({g.window for g in groups if g.window is not None})
    return f"{full} full-attention group(s)" + (f" + {len(groups) - full} sliding-window group(s) (window "
                                                 f"{', '.join(map(str, sliding))})" if sliding else "")


__all__ = ["KVGroup", "blocks_needed", "describe", "kv_groups", "layer_specs"]

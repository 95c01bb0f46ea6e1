"""A host-side stand-in for vLLM's hybrid paged KV cache, to drive decode steps without an engine.

It keeps what vLLM's KV-cache manager keeps for this model: per KV-cache group a pool of blocks (block 0
is the null block and is never handed out), a block table per request and a slot mapping per step; sliding
groups drop blocks that fell out of the window to the null block, as ``SlidingWindowManager`` does. Memory
never written -- the null block, fresh blocks, freed blocks -- holds NaN, so any read of it shows up.
Block ids are handed out in a shuffled order so that tests do not pass by accident on contiguous layouts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from vllm_megakernel.reference import DecodeInputs, KVGroup, ModelDims


def hybrid_groups(dims: ModelDims) -> list[list[int]]:
    """Full-attention layers in one group, sliding layers in another (the manager's split by spec)."""
    full = [i for i in range(dims.num_layers) if not dims.sliding[i]]
    sliding = [i for i in range(dims.num_layers) if dims.sliding[i]]
    return [g for g in (full, sliding) if g]


class PagedKVSim:
    def __init__(self, dims: ModelDims, num_requests: int, max_len: int, block_size: int = 16,
                 groups: Sequence[Sequence[int]] | None = None, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", seed: int = 0, spare_blocks: int = 4):
        self.dims = dims
        self.block_size = block_size
        self.groups = [list(g) for g in (groups if groups is not None else hybrid_groups(dims))]
        self.layer_group = [-1] * dims.num_layers
        for g, layers in enumerate(self.groups):
            for layer in layers:
                self.layer_group[layer] = g
        if -1 in self.layer_group:
            raise ValueError("every layer must belong to exactly one KV-cache group")
        self.max_blocks = -(-max_len // block_size)
        shape = self.cache_shape(dims, num_requests, max_len, block_size, spare_blocks)
        num_blocks = shape[0]
        self.kv_caches = [torch.full(shape, float("nan"), dtype=dtype, device=device)
                          for _ in range(dims.num_layers)]
        rng = random.Random(seed)
        self.free: list[list[int]] = []
        for _ in self.groups:
            ids = list(range(1, num_blocks))
            rng.shuffle(ids)
            self.free.append(ids)
        self.tables = [torch.zeros(num_requests, self.max_blocks, dtype=torch.int32, device=device)
                       for _ in self.groups]
        self.lens = [0] * num_requests
        self.device = device

    @staticmethod
    def cache_shape(dims: ModelDims, num_requests: int, max_len: int, block_size: int = 16,
                    spare_blocks: int = 4) -> tuple[int, int, int, int, int]:
        """One layer's cache: the null block, every request's ``max_len`` positions, and the spares."""
        return (1 + num_requests * -(-max_len // block_size) + spare_blocks, 2, block_size, dims.num_kv_heads,
                dims.head_dim)

    @staticmethod
    def cache_bytes(dims: ModelDims, num_requests: int, max_len: int, block_size: int = 16,
                    dtype: torch.dtype = torch.float32, spare_blocks: int = 4) -> int:
        """What the caches of every layer take (each layer holds the whole pool, as allocated above)."""
        shape = PagedKVSim.cache_shape(dims, num_requests, max_len, block_size, spare_blocks)
        return dims.num_layers * torch.Size(shape).numel() * dtype.itemsize

    def _window_of(self, g: int) -> int | None:
        layer = self.groups[g][0]
        return self.dims.sliding_window if self.dims.sliding[layer] else None

    def _drop_out_of_window(self, g: int, r: int, pos: int, window: int) -> None:
        first_needed = pos - window + 1  # the query at `pos` sees keys first_needed..pos
        for j in range(max(0, first_needed) // self.block_size):
            blk = int(self.tables[g][r, j])
            if blk == 0:
                continue
            self.tables[g][r, j] = 0
            for layer in self.groups[g]:
                self.kv_caches[layer][blk].fill_(float("nan"))  # a freed block may hold anyone's data
            self.free[g].append(blk)

    def fill_history(self, lengths: Sequence[int], generator: torch.Generator | None = None,
                     scale: float = 1.0, values: bool = True) -> None:
        """Gives request r a history of ``lengths[r]`` tokens of random K/V, laid out as if prefilled: the
        blocks a sliding group has already dropped are the null block, slots past the history stay NaN.
        Faster than stepping the model through long contexts; the attention reads whatever is cached.
        ``values=False`` only lays out the block tables and leaves the cache contents alone (timing runs
        fill whole caches at once, which is much faster than block by block)."""
        bs = self.block_size
        for r, n in enumerate(lengths):
            if self.lens[r]:
                raise ValueError(f"request {r} already has a history")
            for g in range(len(self.groups)):
                window = self._window_of(g)
                # blocks still needed when the next token (position n) attends
                first = 0 if window is None else max(0, n - window + 1) // bs
                for j in range(first, -(-n // bs)):
                    blk = self.free[g].pop()
                    self.tables[g][r, j] = blk
                    valid = min(bs, n - j * bs)
                    for layer in (self.groups[g] if values else ()):
                        cache = self.kv_caches[layer]
                        vals = torch.randn((2, valid) + tuple(cache.shape[3:]), generator=generator,
                                           dtype=torch.float32) * scale
                        cache[blk, :, :valid] = vals.to(device=cache.device, dtype=cache.dtype)
            self.lens[r] = n

    def step(self, tokens: Sequence[int | None]) -> DecodeInputs:
        """One decode step: ``tokens[r]`` is request r's new token, ``None`` makes row r padding."""
        n = len(tokens)
        slots = [[-1] * n for _ in self.groups]
        positions, seq_lens = [0] * n, [0] * n
        for r, tok in enumerate(tokens):
            if tok is None:
                continue
            pos = self.lens[r]
            for g in range(len(self.groups)):
                window = self._window_of(g)
                if window is not None:
                    self._drop_out_of_window(g, r, pos, window)
                j = pos // self.block_size
                if pos % self.block_size == 0:
                    self.tables[g][r, j] = self.free[g].pop()
                slots[g][r] = int(self.tables[g][r, j]) * self.block_size + pos % self.block_size
            self.lens[r] = pos + 1
            positions[r], seq_lens[r] = pos, pos + 1
        dev = self.device
        live = [t is not None for t in tokens]
        groups = [
            KVGroup(
                # padding rows point at the null block, as vLLM's padded rows do
                block_table=torch.where(torch.tensor(live, device=dev)[:, None], self.tables[g][:n],
                                        torch.zeros_like(self.tables[g][:n])),
                slot_mapping=torch.tensor(slots[g], dtype=torch.int64, device=dev),
            )
            for g in range(len(self.groups))
        ]
        return DecodeInputs(
            input_ids=torch.tensor([t if t is not None else 0 for t in tokens], device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            kv_caches=self.kv_caches,
            layer_group=self.layer_group,
            groups=groups,
        )

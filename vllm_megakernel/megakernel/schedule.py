"""Host-side schedule: one decode step as named waves of tasks, placed round-robin over the SMs.

Each layer is lowered into waves (one tile of one operation per task), in an order that is a topological
order of the step's dependency graph:

    norm -> qkv -> router -> attn_partial -> mlp_up -> attn_combine -> mlp_down -> o_proj -> moe_combine

(``mlp_up``/``mlp_down`` are the expert GEMMs on MoE layers and the dense SwiGLU on the prefix layer, which
has no router and no combine). Tasks are numbered in that order and dealt round-robin to SMs, so every SM's
list is ordered consistently with one global topological order. That makes the step deadlock-free with
spinning waits: the unfinished task with the smallest number is at the head of its SM's list and all of
its inputs have smaller numbers, so it can always run. The simulator checks this rather than trusting it.

Dependencies are barriers (counters). A barrier's target is the number of tasks that signal it -- derived
here, never written by hand -- and every wait on it waits for exactly that target. Work that depends on
live data (sequence lengths, routing) keeps static task counts: an attention split past the end of its
sequence, or an expert slot past the number of experts actually chosen, still runs and still signals, it
just has nothing to compute. Every task declares the logical buffer regions it reads and writes, so the
simulator can prove that every conflicting pair of tasks is ordered by the barriers.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from vllm_megakernel.megakernel.abi import NO_BARRIER, TASK_WORDS, Op, encode
from vllm_megakernel.reference import ModelDims

Region = tuple  # a logical buffer region, e.g. ("q", head) or ("k", layer, kv_head)


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What one task list is built for: the padded batch and the machine."""

    batch: int
    num_sms: int
    tile_n: int = 128  # output columns per GEMM task
    attn_splits: int = 1  # KV splits per (request, kv head)

    def __post_init__(self):
        if self.batch < 1 or self.num_sms < 1 or self.tile_n < 1 or self.attn_splits < 1:
            raise ValueError(f"invalid step shape {self}")


@dataclasses.dataclass
class Barrier:
    name: str
    target: int = 0  # number of tasks that signal it


@dataclasses.dataclass
class Task:
    index: int
    op: Op
    layer: int
    wave: str
    fields: dict[str, int]
    waits: tuple[int, ...]  # barrier ids; each waited on up to its full target
    signal: int  # barrier id or NO_BARRIER
    reads: tuple[Region, ...]
    writes: tuple[Region, ...]
    sm: int = -1

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.fields.items())
        return f"task {self.index} ({self.op.name} layer {self.layer}{', ' + args if args else ''}) on SM {self.sm}"


@dataclasses.dataclass
class Schedule:
    dims: ModelDims
    shape: StepShape
    tasks: list[Task]
    barriers: list[Barrier]
    sm_tasks: list[list[int]]  # per SM, task indices in execution order

    @property
    def num_slots(self) -> int:
        return moe_slots(self.dims, self.shape.batch)

    def encode(self) -> torch.Tensor:
        """[num_sms, max_tasks + 1, TASK_WORDS] int32; each SM's list ends with an END task (all zeros)."""
        longest = max(len(t) for t in self.sm_tasks)
        end = [0] * TASK_WORDS
        rows = []
        for indices in self.sm_tasks:
            sm_rows = []
            for i in indices:
                t = self.tasks[i]
                waits = [(b, self.barriers[b].target) for b in t.waits]
                sm_rows.append(encode(t.op, t.layer, waits, t.signal, t.index, **t.fields))
            rows.append(sm_rows + [end] * (longest + 1 - len(sm_rows)))
        return torch.tensor(rows, dtype=torch.int32)

    def wave_range(self, layer: int, wave: str) -> tuple[int, int]:
        """[start, stop) task indices of one wave of one layer (a wave's tasks are numbered contiguously)."""
        idx = [t.index for t in self.tasks if t.layer == layer and t.wave == wave]
        if not idx:
            raise KeyError(f"layer {layer} has no {wave!r} wave")
        assert idx == list(range(idx[0], idx[-1] + 1)), f"layer {layer} {wave} is not contiguous"
        return idx[0], idx[-1] + 1

    def truncated(self, num_tasks: int) -> Schedule:
        """The step up to (not including) task ``num_tasks``: tasks are numbered in a topological order, so a
        prefix keeps every input of every kept task. Barrier targets are recounted over the kept tasks, so
        the prefix is itself a complete schedule (the simulator's exact-count check holds) and the kernel can
        run it to inspect the workspace between any two waves."""
        tasks = self.tasks[:num_tasks]
        barriers = [Barrier(b.name) for b in self.barriers]
        for t in tasks:
            if t.signal != NO_BARRIER:
                barriers[t.signal].target += 1
        sm_tasks = [[i for i in lst if i < num_tasks] for lst in self.sm_tasks]
        return Schedule(self.dims, self.shape, tasks, barriers, sm_tasks)

    def barrier_name(self, barrier: int) -> str:
        return self.barriers[barrier].name if 0 <= barrier < len(self.barriers) else f"barrier {barrier}"


def moe_slots(dims: ModelDims, batch: int) -> int:
    """Expert slots per MoE layer: at most every expert, at most one per (token, k) pair."""
    return min(dims.num_experts, batch * dims.top_k)


def _tiles(n: int, tile: int, what: str) -> int:
    if n % tile:
        raise ValueError(f"{what} ({n}) is not a multiple of tile_n ({tile})")
    return n // tile


class _Builder:
    def __init__(self, dims: ModelDims, shape: StepShape):
        self.dims, self.shape = dims, shape
        self.tasks: list[Task] = []
        self.barriers: list[Barrier] = []

    def barrier(self, name: str) -> int:
        self.barriers.append(Barrier(name))
        return len(self.barriers) - 1

    def task(self, op: Op, layer: int, wave: str, waits=(), signal=NO_BARRIER, reads=(), writes=(),
             **fields: int) -> None:
        self.tasks.append(Task(len(self.tasks), op, layer, wave, fields, tuple(waits), signal,
                               tuple(reads), tuple(writes)))


def build_schedule(dims: ModelDims, shape: StepShape, moe_intermediate: int,
                   dense_intermediate: int) -> Schedule:
    """The whole decode step (all layers and the final norm) for ``shape``.

    ``moe_intermediate`` / ``dense_intermediate`` are the expert and dense-prefix FFN widths (the config's
    ``intermediate_size`` and ``prefix_dense_intermediate_size``).
    """
    hq, hkv = dims.num_heads, dims.num_kv_heads
    if hq % hkv:
        raise ValueError("query heads must be a multiple of KV heads")
    group = hq // hkv
    B, S, T = shape.batch, shape.attn_splits, shape.tile_n
    h_tiles = _tiles(dims.hidden, T, "hidden size")
    slots = moe_slots(dims, B)
    o_regions = tuple(("o", t) for t in range(h_tiles))
    mlp_regions = tuple(("mlp", t) for t in range(h_tiles))

    b = _Builder(dims, shape)
    prev_o = prev_mlp = None
    for layer in range(dims.num_layers):
        L = f"L{layer}"
        # -- norm: x = embed or x + o + mlp; hn = rmsnorm(x)
        norm = b.barrier(f"{L}.norm")
        if layer == 0:
            b.task(Op.EMBED_RMSNORM, layer, "norm", signal=norm, writes=(("x",), ("hn",)))
        else:
            b.task(Op.ADD_RMSNORM, layer, "norm", waits=(prev_o, prev_mlp), signal=norm,
                   reads=(("x",),) + o_regions + mlp_regions, writes=(("x",), ("hn",)))
        # -- qkv: one head per task; a KV group is its query heads plus its k and v heads
        qkv = [b.barrier(f"{L}.qkv.g{g}") for g in range(hkv)]
        for head in range(hq + 2 * hkv):
            if head < hq:
                g, out = head // group, ("q", head)
            elif head < hq + hkv:
                g = head - hq
                out = ("k", layer, g)
            else:
                g = head - hq - hkv
                out = ("v", layer, g)
            b.task(Op.QKV_ROPE, layer, "qkv", waits=(norm,), signal=qkv[g], reads=(("hn",),),
                   writes=(out,), head=head)
        # -- router (MoE layers)
        dense = dims.dense[layer]
        if not dense:
            route = b.barrier(f"{L}.route")
            b.task(Op.ROUTER, layer, "router", waits=(norm,), signal=route, reads=(("hn",),),
                   writes=(("route",),))
        # -- attention partials
        parts = {(r, g): b.barrier(f"{L}.attn.r{r}.g{g}") for r in range(B) for g in range(hkv)}
        for r in range(B):
            for g in range(hkv):
                q_heads = tuple(("q", hh) for hh in range(g * group, (g + 1) * group))
                for s in range(S):
                    b.task(Op.ATTN_PARTIAL, layer, "attn_partial", waits=(qkv[g],), signal=parts[r, g],
                           reads=q_heads + (("k", layer, g), ("v", layer, g)),
                           writes=(("opart", r, g, s),), request=r, kv_head=g, split=s, num_splits=S)
        # -- mlp up
        if dense:
            i_tiles = _tiles(dense_intermediate, T, "dense intermediate size")
            dup = b.barrier(f"{L}.dense_up")
            for t in range(i_tiles):
                b.task(Op.DENSE_UPGATE, layer, "mlp_up", waits=(norm,), signal=dup, reads=(("hn",),),
                       writes=(("dact", t),), col_tile=t)
        else:
            i_tiles = _tiles(moe_intermediate, T, "expert intermediate size")
            up = [b.barrier(f"{L}.moe_up.s{s}") for s in range(slots)]
            for s in range(slots):
                for t in range(i_tiles):
                    b.task(Op.MOE_UPGATE, layer, "mlp_up", waits=(route,), signal=up[s],
                           reads=(("hn",), ("route",)), writes=(("act", s, t),), slot=s, col_tile=t)
        # -- attention combine
        comb = b.barrier(f"{L}.attn_combine")
        for r in range(B):
            for g in range(hkv):
                b.task(Op.ATTN_COMBINE, layer, "attn_combine", waits=(parts[r, g],), signal=comb,
                       reads=tuple(("opart", r, g, s) for s in range(S)), writes=(("attn", r, g),),
                       request=r, kv_head=g, num_splits=S)
        # -- mlp down
        mlp = b.barrier(f"{L}.mlp")
        if dense:
            for t in range(h_tiles):
                b.task(Op.DENSE_DOWN, layer, "mlp_down", waits=(dup,), signal=mlp,
                       reads=tuple(("dact", i) for i in range(i_tiles)), writes=(("mlp", t),), col_tile=t)
        else:
            down = b.barrier(f"{L}.moe_down")
            for s in range(slots):
                for t in range(h_tiles):
                    b.task(Op.MOE_DOWN, layer, "mlp_down", waits=(up[s],), signal=down,
                           reads=(("route",),) + tuple(("act", s, i) for i in range(i_tiles)),
                           writes=(("eout", s, t),), slot=s, col_tile=t)
        # -- o projection
        o = b.barrier(f"{L}.o_proj")
        attn_regions = tuple(("attn", r, g) for r in range(B) for g in range(hkv))
        for t in range(h_tiles):
            b.task(Op.O_PROJ, layer, "o_proj", waits=(comb,), signal=o, reads=attn_regions,
                   writes=(("o", t),), col_tile=t)
        # -- expert combine
        if not dense:
            for t in range(h_tiles):
                b.task(Op.MOE_COMBINE, layer, "moe_combine", waits=(down,), signal=mlp,
                       reads=(("route",),) + tuple(("eout", s, t) for s in range(slots)),
                       writes=(("mlp", t),), col_tile=t)
        prev_o, prev_mlp = o, mlp
    b.task(Op.FINAL_NORM, dims.num_layers, "final_norm", waits=(prev_o, prev_mlp),
           reads=(("x",),) + o_regions + mlp_regions, writes=(("x",), ("out",)))

    for t in b.tasks:
        if t.signal != NO_BARRIER:
            b.barriers[t.signal].target += 1
    sm_tasks: list[list[int]] = [[] for _ in range(shape.num_sms)]
    for t in b.tasks:  # round-robin in wave order
        t.sm = t.index % shape.num_sms
        sm_tasks[t.sm].append(t.index)
    return Schedule(dims, shape, b.tasks, b.barriers, sm_tasks)


def attn_splits_for(max_context: int, keys_per_split: int = 1024, max_splits: int = 16,
                    batch: int | None = None, num_kv_heads: int = 1, num_sms: int | None = None) -> int:
    """Splits per (request, kv head): enough that each split reads ~keys_per_split keys of the longest
    context, but no more than it takes to give every SM about two attention tasks -- a large batch is
    already parallel across requests, and every split is a task, a partial result and a combine input."""
    splits = max(1, min(max_splits, math.ceil(max_context / keys_per_split)))
    if batch is not None and num_sms is not None:
        splits = min(splits, max(1, math.ceil(2 * num_sms / (batch * num_kv_heads))))
    return splits

"""Host-side schedule: one decode step as named waves of tasks, placed round-robin over the SMs.

Each layer is lowered into waves (one tile of one operation per task), in an order that is a topological
order of the step's dependency graph. A MoE layer, with the RMSNorm folded into the tasks that read it:

    router -> qkv -> router_topk -> attn_partial -> mlp_up -> attn_combine -> mlp_down -> o_proj -> moe_combine

The dense prefix layer has no router, top-k or combine (``mlp_up``/``mlp_down`` are its SwiGLU). Batches from
``layout.WIDE_FROM_BATCH`` rows start each layer with a ``norm`` wave instead (row chunks on many SMs;
``layout.fold_norm``; with ``StepShape.combine_in_norm`` that wave also sums the previous MoE layer's expert
outputs, and no ``moe_combine`` wave is built), and the step ends with a ``final_norm`` wave. Tasks are numbered in that order and
dealt round-robin to SMs (restarting at SM 0 on every layer by default: ``StepShape.deal``), each SM's list in
number order, so every SM's list is ordered consistently with one global topological order. That makes the
step deadlock-free with spinning waits: the unfinished task with the smallest number is at the head of its
SM's list and all of its inputs have smaller numbers, so it can always run. The kernel's producer warp, which
issues a task's weight loads ahead of its consumers, waits only on barriers of lower-numbered tasks (the
routing of its layer for expert weights, the layer's qkv for the tile holding the new token's K/V), so the
argument carries over. The simulator checks this rather than trusting it.

Dependencies are barriers (counters). A barrier's target is the number of tasks that signal it -- derived
here, never written by hand -- and every wait on it waits for exactly that target. Work that depends on
live data (sequence lengths, routing) keeps static task counts: an attention split past the end of its
sequence still runs and still signals, it just has nothing to compute (and skips its waits:
abi.WAITS_ONLY_IF_WORK). An expert slot past the number of experts actually chosen is the exception: its
tasks are skipped by their producers, and the layer's top-k signals the down wave's barrier for them
(abi.py's routed descriptors; simulate.run's ``live_slots``). Every task declares the
logical buffer regions it reads and writes, so the simulator can prove that every conflicting pair of
tasks is ordered by the barriers. A region is a tuple key; a write names a whole key, a read may name a
prefix of keys (``("o", 1)`` reads every ``("o", 1, unit)``).

The residual stream x and the layer outputs o and mlp alternate between two buffers by layer parity
(layer l writes index l % 2 and reads (l - 1) % 2), so a late reader of one layer's inputs (an expert's
up/gate) never races the writers of the next layer's.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable

import torch

from vllm_megakernel.megakernel import layout
from vllm_megakernel.megakernel.abi import (
    NO_BARRIER,
    ROUTED_OPS,
    TASK_WORDS,
    WAITS_ONLY_IF_WORK,
    Op,
    encode,
    field_index,
)
from vllm_megakernel.reference import ModelDims

Region = tuple  # a logical buffer region, e.g. ("q", tile) or ("kv", layer, tile), (..., slice) for a batch slice
POSTED_ROUTES = "route_posts"  # (POSTED_ROUTES, layer): a layer's posted route words, read through Task.load_post

# Orders of a layer's waves (each a topological order of the layer's dependencies; the dense prefix layer
# skips the MoE-only waves). Tasks are dealt to SMs in this order, and each SM runs its list in order, so
# the order decides what an SM's consumers and producer do first.
WAVE_ORDERS = {
    # routing first (it heads the longer, MoE, half of the parallel block), attention before the experts,
    # attention's combine between the expert up/gate and down tasks (measured fastest at batch 1 and 8:
    # benchmarks/results/h200-2026-12-01-v2-kernel-profile)
    "default": ("router", "qkv", "router_topk", "attn_partial", "mlp_up", "attn_combine", "mlp_down", "o_proj",
                "moe_combine"),
    # the combine after the expert down tasks
    "experts_then_combine": ("router", "qkv", "router_topk", "attn_partial", "mlp_up", "mlp_down", "attn_combine",
                             "o_proj", "moe_combine"),
    # the expert up/gate tasks ahead of attention in every SM's list: an attention task waits for the
    # layer's qkv and holds up the streaming of the tasks behind it on its SM
    "experts_before_attention": ("router", "qkv", "router_topk", "mlp_up", "attn_partial", "attn_combine",
                                 "mlp_down", "o_proj", "moe_combine"),
    # attention's combine right after attention (at batch 1 the combine waited behind expert up/gate tasks
    # on its SMs, and the O projection behind it: the attention half ended the layer), the O projection
    # still after the experts
    "combine_before_experts": ("router", "qkv", "router_topk", "attn_partial", "attn_combine", "mlp_up",
                               "mlp_down", "o_proj", "moe_combine"),
    # the default with the O projection ahead of the expert down tasks in every SM's list
    "o_proj_before_down": ("router", "qkv", "router_topk", "attn_partial", "mlp_up", "attn_combine", "o_proj",
                           "mlp_down", "moe_combine"),
    # the whole attention half, then the MoE half
    "attention_first": ("qkv", "attn_partial", "attn_combine", "o_proj", "router", "router_topk", "mlp_up",
                        "mlp_down", "moe_combine"),
    # the combine and O projection right after attention, the experts last
    "attention_then_experts": ("router", "qkv", "router_topk", "attn_partial", "attn_combine", "o_proj", "mlp_up",
                               "mlp_down", "moe_combine"),
}
MOE_ONLY_WAVES = ("router", "router_topk", "moe_combine")
ROUTING_WAVES = ("router", "router_topk")  # what StepShape.routing_sms reserves SMs for
DEALS = ("by_layer", "continuous")  # StepShape.deal
SPLIT_ORDERS = ("ascending", "descending", "live_first")  # StepShape.split_order
COMBINE_PLACES = ("round_robin", "empty_splits")  # StepShape.combine_place
UNIT = 16  # columns per region unit of the hidden-wide outputs o and mlp
COMBINE_COLS = 128  # columns per MOE_COMBINE task


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What one task list is built for: the padded batch, the machine, and the schedule's choices, each
    defaulting to what layout.py picks for the batch: the attention split (0: attn_splits_for), heads per
    combine (0: combine_heads_for), the norm ("auto": folded into its readers up to the register batch,
    "wave": a norm wave, "fold": folded), GEMM task sizes (``tiles``: (GemmTiles field, value) pairs that
    replace layout.gemm_tiles' choice), the order of a layer's waves (a WAVE_ORDERS key), whether the
    expert tasks are claimed from a per-wave counter (abi's ``claim`` field) or run the tile they were
    dealt, where each layer's O projection places are dealt (``o_within_down``: after that fraction of the
    layer's down-wave places instead of after all of them; 0 keeps the wave order's place; None, the
    default, takes layout.o_within_down_for the batch where the order allows it, else 0), the hidden
    columns of a MOE_COMBINE task (``moe_combine_cols``, a multiple of UNIT dividing the hidden size; 0:
    COMBINE_COLS), whether a MoE layer's combine is folded into the next norm (``combine_in_norm``: no
    MOE_COMBINE wave; the NORM tasks, one batch row each with all consumer warps on it, sum each row's
    expert outputs themselves; only where the norm is a wave of its own; None: layout.combine_in_norm_for the
    batch), into how many batch-row slices each QKV tile is split (``qkv_batch_split``: a task per tile and
    slice, where the grouped GEMM's time grows with the rows; only where the norm is a wave; 0:
    layout.qkv_batch_split_for the batch), likewise each O projection tile (``o_batch_split``; at any batch; 0:
    layout.o_batch_split_for the batch), and how tasks are dealt to SMs (``deal``): round-robin in task order restarting at SM 0 on every
    layer ("by_layer"), so that a layer's router tasks and top-k run on the same SMs every layer and its
    qkv tasks on the SMs after them, or round-robin over the whole step ("continuous"). Dealt by layer,
    the router and top-k code stays in those SMs' instruction caches: router tasks 11.0 -> 9.0 us and
    the top-k 7.0 -> 6.0 us at batch 1, the step -4% at batch 1, -2% at 2, -1% at 4, +1% at 8 (within the
    spread; benchmarks/results/h200-2026-12-01-v2-deal-by-layer). ``routing_sms`` (0: off) goes further:
    SMs 0 .. routing_sms - 1 hold every MoE layer's router tasks and top-k and nothing else of those layers
    (the other waves are dealt over the remaining SMs, and the default attention split counts only those),
    so the routing's SMs keep only its code and start each layer idle; a schedule choice for batch 1's
    routing chain, which was on the layer's critical path in session P's signal-delay probes (PERF_LOG #90).
    ``attn_live_tasks`` (-1: layout.attn_live_tasks_for the batch; 0: off) caps the live attention tasks of a
    step: a request's keys go to at most attn_live_tasks // batch of its splits as long as a split stays within
    ``attn_max_tiles`` tiles (layout.attn_split_tiles), so a short history occupies fewer SMs while a long
    one still spreads over every split; ``split_order`` ("ascending" or "descending"; None: descending where
    the cap is on) is the order each request's splits are dealt in (_attn_partial_wave); "live_first" deals
    every request's first split, then every request's second, ..., so the cap's live splits (attn_live_tasks
    of them) are dealt first, on the SMs right after the layer's routing and qkv tasks, and the next wave's
    round-robin starts right after the live ones (its extra places land on SMs of empty splits). ``combine_place``:
    the ATTN_COMBINE tasks dealt round-robin with the rest ("round_robin"), or ("empty_splits") onto the SMs
    of the layer's highest-numbered splits, which a short history leaves empty (the other waves keep their
    round-robin SMs); None: layout.combine_place_for the batch. ``local_routing`` (None: layout.local_routing_for
    the batch): every expert task's producer chooses the layer's experts itself from the router's scores, so
    the expert tasks wait on the router wave instead of the top-k (which still runs, for the MoE combine's
    weights, which the combine then waits for); up to layout.LOCAL_ROUTING_MAX_BATCH rows, with a MoE
    combine wave (not combine_in_norm). ``posted_routing`` (None: layout.posted_routing_for the batch): the top-k
    posts each slot of its work list as one self-flagged word (abi.ROUTE_POST) and every expert task's producer
    polls its slot's word (``Task.load_post``) after waiting on the router wave, instead of waiting on the top-k's
    barrier and then reading the route buffer; the MoE combine waits on the top-k for its weights, as with local
    routing, under the same limits (layout.POSTED_ROUTING_MAX_BATCH rows, a MoE combine wave), and not with
    local routing. ``posted_scores`` (None: layout.posted_scores_for the batch): every ROUTER task also stores its
    scores as the top-k's ranking keys in the step's barrier array (layout.score_post_words), and the top-k polls
    its rows' keys instead of waiting on the router wave's barrier (``Task.polls_inputs``); with posted routing
    only (so up to layout.POSTED_ROUTING_MAX_BATCH rows, not with local routing): its expert tasks' producers wait on
    the router wave, which orders the hn rows the first router task wrote, while the top-k, having polled the keys
    alone, passes nothing of the routers on. ``stages_in_flight`` (0: layout.stages_in_flight_for the batch) caps the
    producer's stage-ring buffers in flight at once, 1 to layout.STAGES (the whole ring): a launch choice that
    changes when each SM's copies are issued, never what is computed. ``o_prefetch``: a producer that first
    reaches one of a MoE layer's routed places asks L2 for the weight rows of its SM's O projection places of the
    layer before it waits on the routing (PERF_LOG #162: at batch 1 HBM has nothing else to fetch while the
    routing chain runs); a launch choice like stages_in_flight, off by default: on an H100 it moved the O bytes without
    saving time, 0-1% slower at batch 1-8 (the up/gate stages slowed by what O and down gained)."""

    batch: int
    num_sms: int
    attn_splits: int = 0
    attn_min_tiles: int = layout.DEFAULT_ATTN_MIN_TILES
    attn_live_tasks: int = -1
    attn_max_tiles: int = layout.DEFAULT_ATTN_MAX_TILES
    combine_heads: int = 0
    norm: str = "auto"
    tiles: tuple[tuple[str, int], ...] = ()
    order: str = "default"
    expert_claims: bool = True
    o_within_down: float | None = None
    deal: str = "by_layer"
    moe_combine_cols: int = 0
    combine_in_norm: bool | None = None
    qkv_batch_split: int = 0
    o_batch_split: int = 0
    routing_sms: int = 0
    split_order: str | None = None
    combine_place: str | None = None
    local_routing: bool | None = None
    posted_routing: bool | None = None
    posted_scores: bool | None = None
    stages_in_flight: int = 0
    o_prefetch: bool = False

    def __post_init__(self):
        if self.order not in WAVE_ORDERS:
            raise ValueError(f"order={self.order!r}: one of {sorted(WAVE_ORDERS)}")
        if self.norm not in ("auto", "wave", "fold") or (self.norm == "fold" and self.batch > layout.REGISTER_BATCH):
            raise ValueError(f"norm={self.norm!r}: 'auto', 'wave', or 'fold' up to batch {layout.REGISTER_BATCH}")
        if self.deal not in DEALS:
            raise ValueError(f"deal={self.deal!r}: one of {DEALS}")
        if self.combine_in_norm is None:
            object.__setattr__(self, "combine_in_norm", layout.combine_in_norm_for(self.batch))
        if self.qkv_batch_split == 0:
            object.__setattr__(self, "qkv_batch_split", layout.qkv_batch_split_for(self.batch))
        if self.o_batch_split == 0:
            object.__setattr__(self, "o_batch_split", layout.o_batch_split_for(self.batch))
        for name in ("qkv_batch_split", "o_batch_split"):
            if not 1 <= getattr(self, name) <= self.batch:
                raise ValueError(f"{name}={getattr(self, name)}: 1 to the batch ({self.batch})")
        if self.moe_combine_cols < 0 or self.moe_combine_cols % UNIT:
            raise ValueError(f"moe_combine_cols={self.moe_combine_cols}: a multiple of {UNIT} (0: {COMBINE_COLS})")
        waves = WAVE_ORDERS[self.order]
        o_movable = (waves.index("attn_combine") < waves.index("mlp_down")
                     and waves.index("o_proj") == waves.index("mlp_down") + 1)
        if self.o_within_down is None:
            object.__setattr__(self, "o_within_down", layout.o_within_down_for(self.batch) if o_movable else 0.0)
        if not 0.0 <= self.o_within_down < 1.0:
            raise ValueError(f"o_within_down={self.o_within_down}: a fraction of the down places, in [0, 1)")
        if self.o_within_down and not o_movable:
            # an O place among the down places waits on the combine: the SM's own combine tasks must come
            # before it in its list, and the O wave must follow the down wave to be moved into it
            raise ValueError(f"o_within_down needs an order with attn_combine before mlp_down and o_proj right "
                             f"after it; {self.order!r} is not one")
        if self.attn_live_tasks == -1:
            object.__setattr__(self, "attn_live_tasks", layout.attn_live_tasks_for(self.batch))
        if self.split_order is None:  # the cap's live splits dealt last (layout.attn_live_tasks_for)
            object.__setattr__(self, "split_order", "descending" if self.attn_live_tasks else "ascending")
        if self.split_order not in SPLIT_ORDERS:
            raise ValueError(f"split_order={self.split_order!r}: one of {SPLIT_ORDERS}")
        if self.combine_place is None:
            object.__setattr__(self, "combine_place", layout.combine_place_for(self.batch))
        if self.combine_place not in COMBINE_PLACES:
            raise ValueError(f"combine_place={self.combine_place!r}: one of {COMBINE_PLACES}")
        if self.local_routing is None:
            object.__setattr__(self, "local_routing", layout.local_routing_for(self.batch))
        if self.local_routing and (self.batch > layout.LOCAL_ROUTING_MAX_BATCH or self.combine_in_norm):
            raise ValueError(f"local_routing: up to batch {layout.LOCAL_ROUTING_MAX_BATCH} with a MoE combine wave "
                             f"(batch {self.batch}, combine_in_norm={self.combine_in_norm})")
        if self.posted_routing is None:
            object.__setattr__(self, "posted_routing", layout.posted_routing_for(self.batch) and not self.local_routing)
        if self.posted_routing and (self.batch > layout.POSTED_ROUTING_MAX_BATCH or self.combine_in_norm
                                    or self.local_routing):
            raise ValueError(f"posted_routing: up to batch {layout.POSTED_ROUTING_MAX_BATCH} with a MoE combine wave, "
                             f"without local_routing (batch {self.batch}, combine_in_norm={self.combine_in_norm}, "
                             f"local_routing={self.local_routing})")
        if self.posted_scores is None:
            object.__setattr__(self, "posted_scores", layout.posted_scores_for(self.batch) and self.posted_routing)
        if self.posted_scores and not self.posted_routing:
            # without posted routing the expert tasks wait on the top-k's barrier alone, and the top-k, which only
            # polled the routers' keys, does not pass on the routers' other writes (the up/gate tasks' hn rows)
            raise ValueError(f"posted_scores: with posted_routing, whose producers wait on the router wave "
                             f"(batch {self.batch}, posted_routing={self.posted_routing})")
        if self.stages_in_flight == 0:
            object.__setattr__(self, "stages_in_flight", layout.stages_in_flight_for(self.batch))
        if not 1 <= self.stages_in_flight <= layout.STAGES:
            raise ValueError(f"stages_in_flight={self.stages_in_flight}: 1 to the ring's {layout.STAGES} buffers "
                             f"(0: the layout's choice for the batch)")
        if self.attn_live_tasks < 0 or self.attn_max_tiles < 1:
            raise ValueError(f"attn_live_tasks={self.attn_live_tasks} (0: off), attn_max_tiles={self.attn_max_tiles}: "
                             f"at least 1")
        if self.batch < 1 or self.num_sms < 1 or self.attn_splits < 0 or self.attn_min_tiles < 1:
            raise ValueError(f"invalid step shape {self}")
        if self.batch > layout.MAX_BATCH:
            raise ValueError(f"batch {self.batch} is larger than the kernel takes ({layout.MAX_BATCH})")
        if self.attn_splits > layout.MAX_ATTN_SPLITS:
            raise ValueError(f"{self.attn_splits} attention splits: the kernel takes at most {layout.MAX_ATTN_SPLITS}")
        if not 0 <= self.routing_sms < self.num_sms:
            raise ValueError(f"routing_sms={self.routing_sms}: 0 (off) to {self.num_sms - 1} (an SM must be left "
                             f"for the rest of the layer)")
        if self.attn_splits == 0:
            object.__setattr__(self, "attn_splits",
                               layout.attn_splits_for(self.batch, self.num_sms - self.routing_sms))

    @property
    def attn_live_splits(self) -> int:
        """Live splits per request under ``attn_live_tasks`` (layout.attn_split_tiles' ``live_splits``)."""
        return layout.attn_live_splits_for(self.batch, self.attn_live_tasks)


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
    load_wait: int = NO_BARRIER  # barrier the producer waits on before the loads that depend on this step
    sm: int = -1
    # the task whose posted words the producer polls after load_wait, before it completes this (routed)
    # descriptor (StepShape.posted_routing: the layer's top-k); -1: none. A flag in the data, not a barrier:
    # it orders the posted words alone (simulate.check_races), and the kernel derives it from the layer
    load_post: int = -1
    # the consumers poll the inputs' own posted words instead of waiting on ``waits`` (the top-k under
    # StepShape.posted_scores: the router wave's score keys, each a flag of its own); the kernel skips the waits
    # of such a task and its body polls (under uniform routing the top-k reads no scores and waits as before). Seeing every word posted is seeing every writer of ``waits`` finished
    # with them, so the simulator runs the task after its waits as ever; but a poll orders only the words it
    # read, so it passes on to the tasks after it only what it knew before them (simulate.HappensBefore)
    polls_inputs: bool = False

    @property
    def claim(self) -> int:
        """The counter this task takes its tile from (abi's ``claim`` field), or NO_BARRIER."""
        return self.fields.get("claim", NO_BARRIER)

    @property
    def waits_only_if_work(self) -> bool:
        """The kernel skips this task's waits on a step where it has nothing to do (abi.WAITS_ONLY_IF_WORK)."""
        return self.op in WAITS_ONLY_IF_WORK

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.fields.items())
        return f"task {self.index} ({self.op.name} layer {self.layer}{', ' + args if args else ''}) on SM {self.sm}"


@dataclasses.dataclass
class Schedule:
    dims: ModelDims
    shape: StepShape
    tiles: layout.GemmTiles
    tasks: list[Task]
    barriers: list[Barrier]
    sm_tasks: list[list[int]]  # per SM, task indices in execution order

    @property
    def num_slots(self) -> int:
        return layout.moe_slots(self.dims, self.shape.batch)

    @property
    def combine_heads(self) -> int:
        return _heads_per_combine(self.dims, self.shape)

    def encode(self) -> torch.Tensor:
        """[num_sms, max_tasks + 1, TASK_WORDS] int32; each SM's list ends with an END task (all zeros). Each
        task's words are abi.encode's (which checks the first task of every opcode and field set), written a
        column at a time (a test compares the two): task by task, the encoding took 4.2 s at batch 64's 385K
        tasks, and vLLM builds a step per batch size at start-up (the decoder keeps each size's encoding)."""
        longest = max(len(t) for t in self.sm_tasks)
        out = torch.zeros(len(self.sm_tasks), longest + 1, TASK_WORDS, dtype=torch.int32)
        place = {i: (sm, k) for sm, indices in enumerate(self.sm_tasks) for k, i in enumerate(indices)}
        groups: dict[tuple, list[Task]] = defaultdict(list)  # one layout of words per opcode and field set
        for t in self.tasks:
            if t.index in place:
                groups[(t.op, len(t.waits), tuple(t.fields))].append(t)
        count = [b.target for b in self.barriers] + [0]  # count[NO_BARRIER] (the last) is 0
        for (op, nwaits, names), tasks in groups.items():
            first = self._words(tasks[0])  # abi.encode checks the group's layout: <= 2 waits, no field missing
            waits = [[t.waits[w] if w < nwaits else NO_BARRIER for t in tasks] for w in range(2)]
            cols = {"opcode": [int(op)] * len(tasks), "layer": [t.layer for t in tasks],
                    "wait0_barrier": waits[0], "wait0_count": [count[b] for b in waits[0]],
                    "wait1_barrier": waits[1], "wait1_count": [count[b] for b in waits[1]],
                    "signal_barrier": [t.signal for t in tasks], "task_index": [t.index for t in tasks],
                    "load_wait_barrier": [t.load_wait for t in tasks],
                    "load_wait_count": [count[t.load_wait] for t in tasks],
                    **{name: [int(t.fields[name]) for t in tasks] for name in names}}
            block = torch.zeros(len(tasks), TASK_WORDS, dtype=torch.int32)
            for name, values in cols.items():
                block[:, field_index(op, name)] = torch.tensor(values, dtype=torch.int32)
            if block[0].tolist() != first:
                raise AssertionError(f"{op.name}: the column encoding differs from abi.encode's")
            where = [place[t.index] for t in tasks]
            out[[sm for sm, _ in where], [k for _, k in where]] = block
        return out

    def _words(self, t: Task) -> list[int]:
        waits = [(b, self.barriers[b].target) for b in t.waits]
        load = (t.load_wait, self.barriers[t.load_wait].target) if t.load_wait != NO_BARRIER else (NO_BARRIER, 0)
        return encode(t.op, t.layer, waits, t.signal, t.index, load, **t.fields)

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
        # A top-k makes up the dead slots' skipped down tiles of its whole wave: only where the prefix keeps
        # that wave whole (else its kept dead tiles stay unsignalled, and nothing kept waits on them).
        whole = {b for b, bar in enumerate(barriers) if bar.target == self.barriers[b].target}
        tasks = [dataclasses.replace(t, fields={**t.fields, "down_barrier": NO_BARRIER})
                 if t.op == Op.ROUTER_TOPK and t.fields["down_barrier"] not in whole else t for t in tasks]
        sm_tasks = [[i for i in lst if i < num_tasks] for lst in self.sm_tasks]
        return Schedule(self.dims, self.shape, self.tiles, tasks, barriers, sm_tasks)

    def barrier_name(self, barrier: int) -> str:
        return self.barriers[barrier].name if 0 <= barrier < len(self.barriers) else f"barrier {barrier}"

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    @property
    def num_barriers(self) -> int:
        return len(self.barriers)

    @property
    def route_post_words(self) -> int:
        """uint64 words the posted routing needs after the barriers (layout.route_post_words); 0 without it."""
        return layout.route_post_words(self.dims, self.shape.batch) if self.shape.posted_routing else 0

    @property
    def score_post_words(self) -> int:
        """uint32 words the posted scores need after the route words (layout.score_post_words); 0 without them."""
        return layout.score_post_words(self.dims, self.shape.batch) if self.shape.posted_scores else 0

    @property
    def sm_task_counts(self) -> tuple[int, ...]:
        return tuple(len(lst) for lst in self.sm_tasks)


class EncodedSchedule:
    """What a step's tables need of a built schedule (its shape, the counts the tables are sized by) once
    the schedule is encoded, with its task list dropped: over vLLM's 11 FULL capture sizes the full model's Task
    objects cost ~1.8 GB of host memory and ~3M objects for every full garbage collection to walk (session AD, CPU
    machine: 0.95 s a collection against 0.05 s without them; vLLM collects several times at start-up).
    ``tasks``, ``barriers``, ``sm_tasks`` and ``barrier_name`` rebuild the schedule with ``rebuild`` on first use
    (a stall report, a trace): the builder is deterministic, and the rebuilt schedule must encode to ``encoded``,
    the tables the kernel ran (a stall report names tasks by their place in them)."""

    def __init__(self, sched: Schedule, encoded: torch.Tensor, rebuild: Callable[[], Schedule]):
        self.dims, self.shape, self.tiles = sched.dims, sched.shape, sched.tiles
        self.encoded = encoded
        self.num_slots, self.combine_heads = sched.num_slots, sched.combine_heads
        self.num_tasks, self.num_barriers, self.sm_task_counts = sched.num_tasks, sched.num_barriers, \
            sched.sm_task_counts
        self.route_post_words, self.score_post_words = sched.route_post_words, sched.score_post_words
        self._rebuild = rebuild
        self._full: Schedule | None = None

    def full(self) -> Schedule:
        if self._full is None:
            full = self._rebuild()
            if (full.shape, full.num_barriers) != (self.shape, self.num_barriers) or \
                    not torch.equal(full.encode(), self.encoded):
                raise RuntimeError(f"the batch-{self.shape.batch} schedule rebuilt differs from the one encoded")
            self._full = full
        return self._full

    @property
    def tasks(self) -> list[Task]:
        return self.full().tasks

    @property
    def barriers(self) -> list[Barrier]:
        return self.full().barriers

    @property
    def sm_tasks(self) -> list[list[int]]:
        return self.full().sm_tasks

    def barrier_name(self, barrier: int) -> str:
        return self.full().barrier_name(barrier)

    def encode(self) -> torch.Tensor:
        return self.encoded


class _Builder:
    def __init__(self):
        self.tasks: list[Task] = []
        self.barriers: list[Barrier] = []

    def barrier(self, name: str) -> int:
        self.barriers.append(Barrier(name))
        return len(self.barriers) - 1

    def task(self, op: Op, layer: int, wave: str, waits=(), signal=NO_BARRIER, reads=(), writes=(),
             load_wait=NO_BARRIER, load_post=-1, polls_inputs=False, **fields: int) -> None:
        self.tasks.append(Task(len(self.tasks), op, layer, wave, fields, tuple(waits), signal,
                               tuple(reads), tuple(writes), load_wait, load_post=load_post, polls_inputs=polls_inputs))


def _batch_slices(batch: int, k: int) -> list[tuple[int, int]]:
    """A split GEMM wave's batch-row slices, as even as the batch allows: (first row, rows) each; [(0, 0)]
    (every row, the kernel's unsplit form) for k = 1."""
    return [(0, 0)] if k == 1 else [(s * batch // k, (s + 1) * batch // k - s * batch // k) for s in range(k)]


def _units(name: str, parity: int, col0: int, cols: int) -> tuple[Region, ...]:
    return tuple((name, parity, u) for u in range(col0 // UNIT, (col0 + cols) // UNIT))


def build_schedule(dims: ModelDims, shape: StepShape, moe_intermediate: int,
                   dense_intermediate: int) -> Schedule:
    """The whole decode step (all layers and the final norm) for ``shape``.

    ``moe_intermediate`` / ``dense_intermediate`` are the expert and dense-prefix FFN widths (the config's
    ``intermediate_size`` and ``prefix_dense_intermediate_size``).
    """
    hq, hkv, D, H = dims.num_heads, dims.num_kv_heads, dims.head_dim, dims.hidden
    if hq % hkv:
        raise ValueError("query heads must be a multiple of KV heads")
    combine_cols = shape.moe_combine_cols or min(COMBINE_COLS, H)
    if H % UNIT or H % combine_cols:
        raise ValueError(f"hidden size {H} is not a multiple of {UNIT} or of the MOE_COMBINE width {combine_cols}")
    B, S = shape.batch, shape.attn_splits
    tiles = layout.gemm_tiles(dims, moe_intermediate, dense_intermediate, B, dict(shape.tiles))
    fold = layout.fold_norm(B) if shape.norm == "auto" else shape.norm == "fold"
    for choice, on in (("combine_in_norm", shape.combine_in_norm), ("qkv_batch_split", shape.qkv_batch_split > 1)):
        if on and fold:
            raise ValueError(f"{choice} needs a norm wave: batch {B} folds the norm into its readers "
                             f"(norm={shape.norm!r})")
    # the QKV and O tasks' batch-row slices
    qkv_slices = _batch_slices(B, shape.qkv_batch_split)
    o_slices = _batch_slices(B, shape.o_batch_split)
    slots = layout.moe_slots(dims, B)
    heads_per_combine = _heads_per_combine(dims, shape)
    # row chunks of x / hn (NORM tasks, region units): NORM_ROWS rows, a warp each, or one row on every
    # consumer warp where the MoE combine is folded in (csrc NormOp's row_warps)
    norm_rows = 1 if shape.combine_in_norm else layout.NORM_ROWS
    row_warps = layout.CONSUMER_WARPS if shape.combine_in_norm else 1
    chunks = range(-(-B // norm_rows))
    qkv_rows = (hq + 2 * hkv) * D

    b = _Builder()
    prev_o = prev_mlp = None

    def moe_in_norm(layer: int) -> bool:
        """Layer ``layer``'s norm sums the previous (MoE) layer's expert outputs: no MOE_COMBINE wave there."""
        return shape.combine_in_norm and layer > 0 and not dims.dense[layer - 1]

    def residual_reads(layer: int) -> tuple[Region, ...]:
        if layer == 0:
            return (("embed",),)
        pp = (layer - 1) % 2
        if moe_in_norm(layer):
            return (("x", pp), ("o", pp), ("topk_w",), ("eout",))
        return (("x", pp), ("o", pp), ("mlp", pp))

    def norm_wave(layer: int, final: bool, wave: str, signal: int) -> None:
        p = layer % 2
        waits = () if layer == 0 else (prev_o, prev_mlp)
        for c in chunks:
            rows = min(norm_rows, B - c * norm_rows)
            writes = (("x", p, c), ("out", c) if final else ("hn", c))
            b.task(Op.NORM, layer, wave, waits=waits, signal=signal, reads=residual_reads(layer), writes=writes,
                   row0=c * norm_rows, rows=rows, final=int(final), moe=int(moe_in_norm(layer)),
                   row_warps=row_warps)

    order = WAVE_ORDERS[shape.order]
    for layer in range(dims.num_layers):
        L, p = f"L{layer}", layer % 2
        dense = dims.dense[layer]
        if fold:
            in_waits = () if layer == 0 else (prev_o, prev_mlp)
            in_reads = residual_reads(layer)
        else:
            norm = b.barrier(f"{L}.norm")
            norm_wave(layer, False, "norm", norm)
            in_waits, in_reads = (norm,), (("hn",),)
        bar: dict[str, int] = {}  # this layer's barriers, by the wave that signals them
        posting = {"topk": -1}  # the task whose posted route words this layer's expert producers poll

        def router_wave():  # scores of tiles of experts; folded: its first task stores hn for the experts
            bar["router"] = b.barrier(f"{L}.router")
            for t in range(dims.num_experts // tiles.router_rows):
                writes = (("scores", layer, t),)
                if fold and t == 0:
                    writes += tuple(("hn", c) for c in chunks)
                b.task(Op.ROUTER, layer, "router", waits=in_waits, signal=bar["router"], reads=in_reads,
                       writes=writes, row0=t * tiles.router_rows, rows=tiles.router_rows, norm=int(fold),
                       write_hn=int(fold and t == 0))

        def qkv_wave():  # tiles of rows of [q; k; v] (by batch-row slices when split); folded: its first task stores x_l
            bar["qkv"] = b.barrier(f"{L}.qkv")
            for t in range(qkv_rows // tiles.qkv_rows):
                r0, r1 = t * tiles.qkv_rows, (t + 1) * tiles.qkv_rows
                for s, (b0, nb) in enumerate(qkv_slices):
                    part = (s,) if nb else ()  # the slice's share of the tile's q / kv region
                    writes = ((("q", t) + part,) if r0 < hq * D else ()) + \
                        ((("kv", layer, t) + part,) if r1 > hq * D else ())
                    if fold and t == 0:
                        writes += tuple(("x", p, c) for c in chunks)
                    b.task(Op.QKV_ROPE, layer, "qkv", waits=in_waits, signal=bar["qkv"], reads=in_reads,
                           writes=writes, row0=r0, rows=tiles.qkv_rows, norm=int(fold), write_x=int(fold and t == 0),
                           batch0=b0, batch_rows=nb)

        def topk_wave():  # top-k and the expert work list
            bar["route"] = b.barrier(f"{L}.route")
            # the down wave's barrier, made up by the top-k for the dead slots' skipped tiles (abi.py)
            bar["down"] = b.barrier(f"{L}.moe_down")
            b.task(Op.ROUTER_TOPK, layer, "router_topk", waits=(bar["router"],), signal=bar["route"],
                   polls_inputs=shape.posted_scores, reads=(("scores", layer),),
                   writes=(("route",), ("topk_w",)) + (((POSTED_ROUTES, layer),) if shape.posted_routing else ()),
                   down_barrier=bar["down"], down_tiles=layout.slot_tiles(H, tiles.moe_down_rows))
            posting["topk"] = len(b.tasks) - 1 if shape.posted_routing else -1

        def attn_wave():
            bar["attn"] = _attn_partial_wave(b, layer, B, S, bar["qkv"], shape.split_order)

        def up_wave():
            if dense:
                bar["dense_up"] = b.barrier(f"{L}.dense_up")
                n = tiles.dense_up_cols
                for t in range(dense_intermediate // n):
                    b.task(Op.DENSE_UPGATE, layer, "mlp_up", waits=in_waits, signal=bar["dense_up"], reads=in_reads,
                           writes=(("dact", t),), col0=t * n, cols=n, norm=int(fold))
                return
            n, route = tiles.moe_up_cols, routing()
            bar["up"] = [b.barrier(f"{L}.moe_up.s{s}") for s in range(slots)]
            claim = b.barrier(f"{L}.moe_up.claims") if shape.expert_claims else NO_BARRIER
            for s in range(slots):  # slot-major: the order claims hand them out in
                for t in range(moe_intermediate // n):
                    b.task(Op.MOE_UPGATE, layer, "mlp_up", waits=(route,), signal=bar["up"][s], load_wait=route,
                           load_post=posting["topk"], reads=(("hn",), routing_read), writes=(("act", s, t),), slot=s,
                           col0=t * n, cols=n, claim=claim)

        def down_wave():
            if dense or not moe_in_norm(layer + 1):
                bar["mlp"] = b.barrier(f"{L}.mlp")
            if dense:
                n = tiles.dense_down_rows
                for t in range(H // n):
                    b.task(Op.DENSE_DOWN, layer, "mlp_down", waits=(bar["dense_up"],), signal=bar["mlp"],
                           reads=(("dact",),), writes=_units("mlp", p, t * n, n), row0=t * n, rows=n)
                return
            n, route = tiles.moe_down_rows, routing()
            claim = b.barrier(f"{L}.moe_down.claims") if shape.expert_claims else NO_BARRIER
            for s in range(slots):
                for t in range(layout.slot_tiles(H, n)):  # every task's rows is n, the last one cut at H
                    b.task(Op.MOE_DOWN, layer, "mlp_down", waits=(bar["up"][s],), signal=bar["down"],
                           load_wait=route, load_post=posting["topk"], reads=(routing_read, ("act", s)),
                           writes=(("eout", s, t),), slot=s, row0=t * n, rows=n, claim=claim)

        # What an expert task's producer waits on before it completes the descriptor, and what that reads:
        # the top-k's work list; with local routing the router's scores (the producer's own top-k); with posted
        # routing the top-k's posted words, polled after the router wave's barrier (which orders hn for the
        # up/gate task's staged rows: the top-k's fence and barrier no longer stand between them).
        routing_read = ("scores", layer) if shape.local_routing else \
            (POSTED_ROUTES, layer) if shape.posted_routing else ("route",)

        def routing() -> int:
            return bar["router"] if shape.local_routing or shape.posted_routing else bar["route"]

        def combine_wave():
            bar["comb"] = _attn_combine_wave(b, layer, B, hq, heads_per_combine, bar["attn"])

        def o_wave():
            bar["o"] = b.barrier(f"{L}.o_proj")
            n = tiles.o_rows
            for t in range(H // n):
                for s, (b0, nb) in enumerate(o_slices):
                    part = (s,) if nb else ()  # the slice's share of the tile's o units
                    b.task(Op.O_PROJ, layer, "o_proj", waits=(bar["comb"],), signal=bar["o"], reads=(("attn",),),
                           writes=tuple(u + part for u in _units("o", p, t * n, n)), row0=t * n, rows=n,
                           batch0=b0, batch_rows=nb)

        def moe_combine_wave():
            if moe_in_norm(layer + 1):  # the next norm sums the expert outputs: it waits on the down wave
                bar["mlp"] = bar["down"]
                return
            # with local or posted routing no expert task waited for the top-k, whose weights the combine reads.
            # The top-k's barrier first: it completed long before the down tiles' (whose last signal the combine
            # waits for), so its check is done while the down wave ends instead of a round trip after it (the
            # consumer leader checks the waits in order; session AE's profile of posted routing: the combine ended
            # 0.9 us later after the down wave with the top-k's wait second)
            waits = (bar["route"], bar["down"]) if shape.local_routing or shape.posted_routing else (bar["down"],)
            for t in range(H // combine_cols):
                b.task(Op.MOE_COMBINE, layer, "moe_combine", waits=waits, signal=bar["mlp"],
                       reads=(("route",), ("topk_w",), ("eout",)),
                       writes=_units("mlp", p, t * combine_cols, combine_cols), col0=t * combine_cols,
                       cols=combine_cols)

        waves = {"router": router_wave, "qkv": qkv_wave, "router_topk": topk_wave, "attn_partial": attn_wave,
                 "mlp_up": up_wave, "mlp_down": down_wave, "attn_combine": combine_wave, "o_proj": o_wave,
                 "moe_combine": moe_combine_wave}
        for wave in order:
            if dense and wave in MOE_ONLY_WAVES:
                continue
            waves[wave]()
        prev_o, prev_mlp = bar["o"], bar["mlp"]
    norm_wave(dims.num_layers, True, "final_norm", NO_BARRIER)
    _check_claim_waves(b.tasks, moe_intermediate, H)
    _check_routed_load_waits(b.tasks, shape.posted_routing)
    return _placed(b, dims, shape, tiles)


def _check_routed_load_waits(tasks: list[Task], posted: bool) -> None:
    """What a producer's RoutingSeen relies on (csrc/ops/moe.cuh): every expert task of a layer waits on one
    barrier, the layer's routing, so having waited for it at one place covers the layer's later places. With
    posted routing each of them polls its own layer's top-k, earlier in the step (the kernel finds the words
    by the layer; nothing else names the task)."""
    first: dict[int, Task] = {}
    for t in tasks:
        if t.op in ROUTED_OPS:
            head = first.setdefault(t.layer, t)
            if t.load_wait != head.load_wait:  # (a load wait is always on the barrier's full target)
                raise AssertionError(f"{t.describe()} waits on another barrier than {head.describe()}")
            post = tasks[t.load_post] if 0 <= t.load_post < t.index else None
            if posted != (t.load_post != -1) or posted and (post is None or post.op != Op.ROUTER_TOPK
                                                            or post.layer != t.layer):
                raise AssertionError(f"{t.describe()} polls task {t.load_post} with posted routing {posted}: "
                                     f"it must poll its layer's earlier top-k exactly when the routing is posted")


def _check_claim_waves(tasks: list[Task], moe_intermediate: int, hidden: int) -> None:
    """What a claiming producer relies on (abi's ``claim``): the n-th task of a wave (by index) is tile
    n % tiles of slot n / tiles (tiles = ceil(total / width), every task of the wave carrying the same width),
    and the slot's barrier is the wave's first slot barrier plus the slot. (One pass, a wave at a time: at
    batch 64 the step has ~300K expert tasks, and vLLM builds a step per batch size at start-up.)"""
    waves: dict[int, list[Task]] = defaultdict(list)
    for t in tasks:
        if t.op in ROUTED_OPS and t.fields.get("claim", NO_BARRIER) != NO_BARRIER:
            waves[t.fields["claim"]].append(t)
    for wave in waves.values():
        head = wave[0]
        up = head.op == Op.MOE_UPGATE
        width_key, first_key = ("cols", "col0") if up else ("rows", "row0")
        width = head.fields[width_key]
        tiles = layout.slot_tiles(moe_intermediate if up else hidden, width)
        head_slot = head.signal if up else head.waits[0]
        for t in wave:
            n, f = t.index - head.index, t.fields
            slot, tile = divmod(n, tiles)
            if t.op != head.op or (f[width_key], f["slot"], f[first_key] // width, t.signal if up else t.waits[0]) \
                    != (width, slot, tile, head_slot + slot):
                raise AssertionError(f"{t.describe()} is not the {n}-th tile of its claimed wave")


def _heads_per_combine(dims: ModelDims, shape: StepShape) -> int:
    """Query heads per ATTN_COMBINE task: the shape's choice, else layout.combine_heads_for's."""
    heads = shape.combine_heads or layout.combine_heads_for(shape.batch, dims.num_heads)
    if dims.num_heads % heads:
        raise ValueError(f"{dims.num_heads} query heads do not split into combines of {heads}")
    return heads


def _attn_partial_wave(b: _Builder, layer: int, batch: int, splits: int, qkv: int,
                       split_order: str = "ascending") -> int:
    """(request, split) tasks over every KV head; they wait for the layer's qkv (``NO_BARRIER``: q and the
    new token's K/V are already in place). Returns the barrier they signal. A short context fills only a
    request's first splits (layout.attn_split_tiles), so with ``split_order="descending"`` each request's
    splits are created, and so dealt, last split first: the live ones sit on the SMs dealt last in the
    wave, and the next wave's round-robin, which starts right after them, gives its extra places (a
    second up/gate place on 60 SMs at batch 1) to the SMs whose split has nothing to do."""
    done = b.barrier(f"L{layer}.attn")
    order = range(splits - 1, -1, -1) if split_order == "descending" else range(splits)
    pairs = [(r, s) for s in order for r in range(batch)] if split_order == "live_first" else \
        [(r, s) for r in range(batch) for s in order]
    for r, s in pairs:
        b.task(Op.ATTN_PARTIAL, layer, "attn_partial", waits=() if qkv == NO_BARRIER else (qkv,), signal=done,
               load_wait=qkv, reads=(("q",), ("kv", layer)), writes=(("opart", r, s),), request=r, split=s)
    return done


def _attn_combine_wave(b: _Builder, layer: int, batch: int, num_heads: int, heads: int, partial: int) -> int:
    done = b.barrier(f"L{layer}.attn_combine")
    for r in range(batch):
        for h0 in range(0, num_heads, heads):
            b.task(Op.ATTN_COMBINE, layer, "attn_combine", waits=(partial,), signal=done, reads=(("opart", r),),
                   writes=(("attn", r, h0),), request=r, head0=h0, heads=heads)
    return done


def _deal_order(tasks: list[Task], shape: StepShape) -> list[Task]:
    """The order tasks are dealt in: step order, except that with ``o_within_down`` each layer's O
    projection wave (right after its down wave in step order, StepShape checks) is dealt after that fraction
    of the down wave. The O projection then runs between down tiles, while HBM streams them, instead of as
    a phase of its own after every SM's last down tile (PERF_LOG, batch 16)."""
    if not shape.o_within_down:
        return tasks
    out, i = [], 0
    while i < len(tasks):
        if tasks[i].wave != "mlp_down":
            out.append(tasks[i])
            i += 1
            continue
        layer, j = tasks[i].layer, i
        while j < len(tasks) and tasks[j].layer == layer and tasks[j].wave == "mlp_down":
            j += 1
        k = j
        while k < len(tasks) and tasks[k].layer == layer and tasks[k].wave == "o_proj":
            k += 1
        cut = i + round((j - i) * shape.o_within_down)
        out += tasks[i:cut] + tasks[j:k] + tasks[cut:j]
        i = k
    return out


def _placed(b: _Builder, dims: ModelDims, shape: StepShape, tiles: layout.GemmTiles) -> Schedule:
    """Barrier targets counted from the signalling tasks, and the tasks dealt round-robin in dealing order
    (_deal_order; restarting at SM 0 on every layer with ``deal="by_layer"``). Every SM's list is in step
    order, a topological order of the dependencies, except for O projection places dealt among the down
    places: those wait only on the attention combine, which is ahead of every down place in every list."""
    for t in b.tasks:
        if t.signal != NO_BARRIER:
            b.barriers[t.signal].target += 1
    sm_tasks: list[list[int]] = [[] for _ in range(shape.num_sms)]
    reserved = shape.routing_sms  # SMs 0 .. reserved - 1: a MoE layer's routing and nothing else of it
    cursor, routing_cursor, layer = 0, 0, None
    split_sms: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # layer -> (-split, request, SM)
    combine_sms: dict[int, list[int]] = {}  # layer -> its split SMs, highest split first (combine_place)
    combines: dict[int, int] = defaultdict(int)  # layer -> its ATTN_COMBINE tasks placed so far
    # split_order="live_first": the round-robin after a layer's partials goes on from its last live split
    live_tasks = min(shape.attn_live_splits or shape.attn_splits, shape.attn_splits) * shape.batch
    partial_start = None  # the cursor at the layer's first partial, while its wave is being dealt
    for t in _deal_order(b.tasks, shape):  # round-robin in dealing order
        if shape.deal == "by_layer" and t.layer != layer:
            cursor, routing_cursor, layer = 0, 0, t.layer
        if shape.split_order == "live_first":
            if t.op == Op.ATTN_PARTIAL and partial_start is None:
                partial_start = cursor
            elif t.op != Op.ATTN_PARTIAL and partial_start is not None:
                cursor, partial_start = partial_start + live_tasks, None
        if shape.combine_place == "empty_splits" and t.op == Op.ATTN_COMBINE and split_sms[t.layer]:
            # after every split of its layer in step order, so any SM's list stays in step order
            if t.layer not in combine_sms:  # highest split first: the ones a short history leaves empty
                combine_sms[t.layer] = [sm for *_, sm in sorted(split_sms[t.layer])]
            places = combine_sms[t.layer]
            t.sm = places[combines[t.layer] % len(places)]
            combines[t.layer] += 1
            cursor += 1  # the other waves keep the SMs the round-robin gives them: only the combines move
        elif reserved and t.layer < dims.num_layers and not dims.dense[t.layer]:  # not the final norm
            if t.wave in ROUTING_WAVES:
                t.sm = routing_cursor % reserved
                routing_cursor += 1
            else:
                t.sm = reserved + cursor % (shape.num_sms - reserved)
                cursor += 1
        else:
            t.sm = cursor % shape.num_sms
            cursor += 1
        if t.op == Op.ATTN_PARTIAL:
            split_sms[t.layer].append((-t.fields["split"], t.fields["request"], t.sm))
        sm_tasks[t.sm].append(t.index)
    return Schedule(dims, shape, tiles, b.tasks, b.barriers, sm_tasks)


def attention_schedule(dims: ModelDims, shape: StepShape, layer: int, moe_intermediate: int,
                       dense_intermediate: int) -> Schedule:
    """One layer's attention alone -- its ATTN_PARTIAL and ATTN_COMBINE waves over q and the paged KV cache
    already in place (no qkv wave to wait for) -- for timing the attention against other implementations
    (benchmarks.attention_bench) and checking it by itself."""
    b = _Builder()
    partial = _attn_partial_wave(b, layer, shape.batch, shape.attn_splits, NO_BARRIER)
    _attn_combine_wave(b, layer, shape.batch, dims.num_heads, _heads_per_combine(dims, shape), partial)
    tiles = layout.gemm_tiles(dims, moe_intermediate, dense_intermediate, shape.batch, dict(shape.tiles))
    return _placed(b, dims, shape, tiles)


__all__ = ["Barrier", "MOE_ONLY_WAVES", "Schedule", "StepShape", "Task", "WAVE_ORDERS", "attention_schedule",
           "build_schedule"]

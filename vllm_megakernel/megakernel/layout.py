"""Shapes shared by the schedule, the CPU simulator, the runtime and the kernel: the one place each is written.

- GEMM tiles: how many weight rows a pipeline stage holds (:func:`rows_per_stage`; rendered into
  ``csrc/abi.h`` for the compiled model) and how many a task covers (:func:`gemm_tiles`).
- Attention splits: a (request, split) task covers a run of 16-token tiles of the request's visible keys;
  :func:`attn_split_tiles` is the formula the kernel's producer, its consumers, the combine and the
  simulator all evaluate on the live sequence length.
- The workspace: every buffer's shape and dtype (:func:`workspace_spec`) and the route buffer's offsets.
- The model shape the kernel is compiled for (:func:`model_mismatches`).
"""

from __future__ import annotations

import dataclasses

from vllm_megakernel.megakernel.abi import KERNEL, MODEL

STAGE_BYTES = KERNEL["stage_bytes"]
STAGES = KERNEL["stages"]  # buffers in the producer's stage ring
CONSUMER_WARPS = KERNEL["consumer_warps"]
PARTIAL_FLOATS = KERNEL["partial_floats"]
REGISTER_BATCH = KERNEL["register_batch"]
ATTN_TILE = KERNEL["attn_tile_tokens"]
MAX_BATCH = KERNEL["max_batch"]
NORM_ROWS = CONSUMER_WARPS  # batch rows per NORM task in a norm wave, a warp each (one row with combine_in_norm)
DEFAULT_ATTN_MIN_TILES = 2  # the smallest split: 32 tokens (64 KB of K/V for the 4 KV heads)
ATTN_LIVE_TASKS = 64  # attn_live_tasks_for: the cap on a step's live attention tasks ...
ATTN_LIVE_UP_TO_BATCH = 8  # ... at batch 1 to this (measured there; off above)
DEFAULT_ATTN_MAX_TILES = 16  # ... as long as a split stays within this many tiles (256 tokens, 512 KB of K/V)
MAX_ATTN_SPLITS = KERNEL["max_attn_splits"]
LOCAL_ROUTING_MAX_BATCH = KERNEL["local_routing_max_batch"]
POSTED_ROUTING_MAX_BATCH = KERNEL["posted_routing_max_batch"]


def rows_per_stage(k: int, elem_bytes: int = 2) -> int:
    """Whole weight rows of length ``k`` per pipeline stage: at most 16 (two 8-row mma tiles) and within
    one stage buffer, so every stage is one contiguous bulk copy."""
    for rows in (16, 8, 4, 2, 1):
        if rows * k * elem_bytes <= STAGE_BYTES:
            return rows
    raise ValueError(f"a weight row of {k} elements does not fit a {STAGE_BYTES}-byte stage")


def compiled_stage_rows() -> dict[str, int]:
    """Rows per stage of each GEMM of the compiled model (csrc/abi.h's k*StageRows)."""
    m = MODEL
    return {
        "qkv": rows_per_stage(m["hidden"]), "o": rows_per_stage(m["num_heads"] * m["head_dim"]),
        "router": rows_per_stage(m["hidden"]), "dense_up": rows_per_stage(m["hidden"]),
        "dense_down": rows_per_stage(m["dense_intermediate"]), "moe_up": rows_per_stage(m["hidden"]),
        "moe_down": rows_per_stage(m["moe_intermediate"]),
    }


def padded_rows(n: int) -> int:
    """Batch rows a GEMM task's partial sums are laid out for: 8 or 16 (one mma tile held in registers),
    else a multiple of 16 (tiles reloaded per stage)."""
    return 8 if n <= 8 else 16 if n <= 16 else -(-n // 16) * 16


@dataclasses.dataclass(frozen=True)
class GemmTiles:
    """Weight rows per task of each GEMM (up/gate tasks: output columns, i.e. that many gate rows and as
    many up rows)."""

    qkv_rows: int
    o_rows: int
    router_rows: int
    dense_up_cols: int
    dense_down_rows: int
    moe_up_cols: int
    moe_down_rows: int  # a slot's last down tile is cut at hidden when this does not divide it


def _pick(total: int, stage_rows: int, target: int, cap: int, what: str, divides: bool = True) -> int:
    """The largest task size <= min(target, cap) that is whole stages and divides ``total`` (at least one
    stage); with ``divides`` False any whole stages (the last task of the run is then cut short)."""
    if not divides and total % stage_rows:
        raise ValueError(f"{what}: {total} is not whole {stage_rows}-row stages, so a cut last task would not be")
    best = 0
    for rows in range(stage_rows, min(max(target, stage_rows), cap, total) + 1, stage_rows):
        if not divides or total % rows == 0:
            best = rows
    if best == 0:
        raise ValueError(f"{what}: no task size of whole {stage_rows}-row stages divides {total} within {cap}")
    return best


def partial_cap(batch: int, stage_rows: int) -> int:
    """The most weight rows a GEMM task of ``batch`` rows may have (csrc/ops/gemm.cuh): with the batch in
    registers every consumer warp keeps a partial sum per (row, batch row) until the task ends; above that
    the task keeps one sum per (row, batch row) plus one stage's per-warp partials."""
    bp = padded_rows(batch)
    in_registers = PARTIAL_FLOATS // (CONSUMER_WARPS * min(bp, REGISTER_BATCH))  # any task of <= 16 rows
    if batch <= REGISTER_BATCH:
        return in_registers
    return min(in_registers, (PARTIAL_FLOATS - CONSUMER_WARPS * stage_rows * bp) // bp)


def slot_tiles(total: int, width: int) -> int:
    """Tiles per expert slot of a wave whose tasks each take ``width`` of ``total`` columns (up/gate) or rows
    (down): the last one narrower when ``width`` does not divide ``total`` (csrc/ops/moe.cuh's claimed_word
    numbers a claimed wave the same way)."""
    return -(-total // width)


def gemm_tiles(dims, moe_intermediate: int, dense_intermediate: int, batch: int,
               targets: dict[str, int] | None = None) -> GemmTiles:
    """Task sizes for ``batch``: about one task per SM for the attention projections at small batches, and
    never more sums than the consumers' buffer holds (:func:`partial_cap`). ``targets`` replaces the
    wanted size of named fields (the nearest size that fits is taken; ``moe_down_rows`` asked for need not
    divide hidden: each slot's last down tile is then narrower)."""
    targets = dict(targets or {})
    unknown = set(targets) - {f.name for f in dataclasses.fields(GemmTiles)}
    if unknown:
        raise ValueError(f"unknown GEMM tile fields {sorted(unknown)}")
    h, q = dims.hidden, dims.num_heads * dims.head_dim
    qkv_total = (dims.num_heads + 2 * dims.num_kv_heads) * dims.head_dim
    big = batch > REGISTER_BATCH  # fewer, larger tasks: per-task costs grow with the batch

    def tile(total, k, target, what, pair=False, uneven=False):
        target = targets.get(what, target)
        rs = rows_per_stage(k)
        cap = partial_cap(batch, rs) // (2 if pair else 1)  # an up/gate task holds as many up rows as gate rows
        return _pick(total, rs, target, cap, what, divides=not uneven)

    down_rows, down_cut = moe_down_default(batch)
    # Batch 1's layer waits on its routing chain (router, top-k, then up/gate): 80 QKV tasks of 64 rows leave
    # 52 SMs free at the head of the layer, and 16 router tasks of 8 rows there end the chain ~2-3 us sooner
    # than 4 of 32 behind 128 QKV tasks (PERF_LOG #50-#51: the step -18.4 / -3.7 / -9.0% in three processes;
    # either change alone within the spread). At batch 2 the pair measured -2.0 / +0.8 / -1.9%, at 4 and 8
    # +0.6 / +0.2%: those keep 40-row QKV tasks and 4 router tasks, one task per SM at the head of each layer
    # (16 router tasks behind 128 QKV tasks put two on 12 SMs: +5% at batch 1, +2% at 8, PERF_LOG #12).
    chain_first = batch == 1
    # from HEAD_SPLIT_FROM_BATCH each QKV tile is split in two batch-row slices (qkv_batch_split_for); from
    # WIDE_HEAD_FROM_BATCH with 80 weight rows a task (128 tasks of half the rows at 64), and O tiles of 32 rows
    # in four slices (o_batch_split_for)
    wide_head = batch >= WIDE_HEAD_FROM_BATCH
    qkv_target = 80 if wide_head else 64 if big or chain_first else 40
    return GemmTiles(
        qkv_rows=tile(qkv_total, h, qkv_target, "qkv_rows"),
        o_rows=tile(h, q, 32 if wide_head else 16, "o_rows"),
        router_rows=tile(dims.num_experts, h, 8 if chain_first else 32, "router_rows"),
        dense_up_cols=tile(dense_intermediate, h, 32 if big else 16, "dense_up_cols", pair=True)
        if dense_intermediate else 0,
        dense_down_rows=tile(h, dense_intermediate, 16, "dense_down_rows") if dense_intermediate else 0,
        # expert tasks of 256 KB at batch 1: each costs ~3 us outside streaming, so fewer and larger ones
        # measured faster (PERF_LOG #8) than 128 KB up/gate and 96 KB down tasks. Batches of 2 to 16 rows
        # route to more experts than there are SMs' worth of 256 KB tasks: up/gate tasks of 96 columns
        # (768 KB; at 16 rows the partial buffer caps them at 48) measured 2-5% faster there (PERF_LOG #15);
        # at batch 1 they lose (8 experts make only 64 such tasks for 132 SMs)
        moe_up_cols=tile(moe_intermediate, h, 96 if 2 <= batch <= REGISTER_BATCH else 32, "moe_up_cols", pair=True),
        moe_down_rows=tile(h, moe_intermediate, down_rows, "moe_down_rows",
                           uneven=down_cut or "moe_down_rows" in targets),
    )


# Batch 5-8 (one 8-row mma tile, as batch 8) take down tasks of the partial buffer's cap, 192 rows, though
# 192 does not divide hidden (each slot's last tile is cut: 10 of 192 and one of 128 at hidden 2048): at
# batch 8 the step -3.2% and -1.6% in two runs against 128 rows (benchmarks/results/h200-2026-12-01-v2-
# dead-places). Batch 1-4 keep 128 (unmeasured; at batch 1 192 would make 88 down tasks for 132 SMs). From
# batch 9 the cap is 96 and the 64 that divides stays: 96 measured -0.3% and 0.0% at batch 16.
UNEVEN_DOWN_BATCHES = range(5, 9)  # the batches padded to one 8-row mma tile, as batch 8 (padded_rows)


def moe_down_default(batch: int) -> tuple[int, bool]:
    """The down task's wanted weight rows (:func:`gemm_tiles` takes the nearest size that fits the partial
    buffer), and whether that size may leave each slot's last tile cut at hidden."""
    if batch in UNEVEN_DOWN_BATCHES:
        return 192, True
    return 128, False


# From batch 16 the step's defaults change (measured at batch 16 only; 17-64 take them unmeasured): the
# norm runs as a wave, at most one attention task per SM, and the O projection is dealt among the down
# places. Together the step -4.8% at batch 16 (15384 -> 14640 us in one run; -4.6% with the folded norm in
# another; benchmarks/results/h200-2026-12-01-v2-o-within-down).
WIDE_FROM_BATCH = 16


def fold_norm(batch: int) -> bool:
    """Small batches fold the RMSNorm into the tasks that read it (no single-SM norm wave on the critical
    path); larger ones run a NORM wave spread over row chunks and every consumer reads hn. At batch 16
    folding costs the router tasks 13.6 us of a 20.5 us task and the top-k waits behind them: the wave
    measured 0.8-1.3% faster there (two runs)."""
    return batch < WIDE_FROM_BATCH


# From batch 32 the head of a layer changes: the MoE combine is folded into the next norm, and each QKV tile is
# split in two batch-row slices (the grouped GEMM's stage time grows with the rows it holds, 3.8 us a stage at 64,
# 1.8 at 32). At batch 64 (80-row QKV tiles, WIDE_HEAD_FROM_BATCH) the step 26706 / 26738 us (default, twice) ->
# 26279 with the fold -> 25550 with the fold and the split (-4.4%) in one process
# (benchmarks/results/h200-2026-12-02-v2-b64-head-racecheck, call 1; PERF_LOG #72-#75); at batch 32 (64-row
# QKV tiles, so 16-row slices in the register form) 19550 -> 19175 us (-1.9%; h200-2026-12-02-v2-o-split-racecheck,
# call 1, PERF_LOG #79). 33-63 take it unmeasured.
HEAD_SPLIT_FROM_BATCH = 32

# From batch 33 QKV tiles have 80 weight rows (128 tasks of 80 x 32 rows at batch 64 instead of 160 of 64 x 32),
# and each O projection tile has 32 rows in four batch-row slices (at 64, 16-row slices in the register form: no
# 512 KB activation reload from L2 a task). The O split at batch 64: 25693 us (default, twice) -> 25372 (-1.25%;
# h200-2026-12-02-v2-o-split-racecheck, call 1, PERF_LOG #80); measured at 64 only.
WIDE_HEAD_FROM_BATCH = 33


def combine_in_norm_for(batch: int) -> bool:
    """Whether a MoE layer's combine is folded into the next norm wave (schedule.StepShape's
    ``combine_in_norm``; see HEAD_SPLIT_FROM_BATCH)."""
    return batch >= HEAD_SPLIT_FROM_BATCH


def qkv_batch_split_for(batch: int) -> int:
    """Batch-row slices per QKV tile (schedule.StepShape's ``qkv_batch_split``; see HEAD_SPLIT_FROM_BATCH)."""
    return 2 if batch >= HEAD_SPLIT_FROM_BATCH else 1


def o_batch_split_for(batch: int) -> int:
    """Batch-row slices per O projection tile (schedule.StepShape's ``o_batch_split``; see WIDE_HEAD_FROM_BATCH)."""
    return 4 if batch >= WIDE_HEAD_FROM_BATCH else 1


# -- attention splits


def attn_splits_for(batch: int, num_sms: int) -> int:
    """Splits per request: at most one attention task per SM across the batch (num_sms // batch, at least one).
    A batch whose split count rounded up would give some SMs two tasks ends its wave one task later: batch 8's
    17 splits (136 tasks on 132 SMs) ran the attention wave alone 1.75-1.85x FlashAttention 3's time, 16
    splits 1.03-1.13x (benchmarks/results/h200-2026-12-02-v2-vllm-tests-two-speeds; 1.01-1.13x in
    h200-2026-12-03-v2-splits-floor-sweep). In one process batch 8's whole step was 1.8% slower at 17 splits
    (PERF_LOG #97, h200-2026-12-03-v2-l2-hints; batch 5 and 7 not timed). At batch 16 the ceiling's
    9 splits (144 tasks) ended attention ~45 us after the median SM (8 splits: the step -1.5 to -2.0%)."""
    return max(1, min(MAX_ATTN_SPLITS, num_sms // batch))


O_WITHIN_DOWN = 0.7  # where o_within_down_for puts the O projection among the down places


def o_within_down_for(batch: int) -> float:
    """The fraction of a layer's down places dealt before its O projection places (schedule.StepShape's
    ``o_within_down``; 0: after all of them). At batch 16 the O projection, left after the down wave, ran
    as a phase of its own at every layer's end (~25 us at 18% of copy bandwidth); dealt after 70% of the
    down places it overlaps them: the step -4.3 / -2.6 / -3.8 / -3.4% at batch 16 in four runs (0.3 and 0.5
    less, 0.8 and 0.9 no better); within the spread at batch 1-8, where it is left off."""
    return O_WITHIN_DOWN if batch >= WIDE_FROM_BATCH else 0.0


def combine_heads_for(batch: int, num_heads: int) -> int:
    """Query heads per ATTN_COMBINE task: one at batch 1-2 (the splits of a long context are many), more as
    the batch brings more requests, at most 8: at batch 64 tasks of all 32 heads (64 tasks, ~38 us each on
    64 SMs, the O projection waiting on them) measured 2.7% and 3.0% slower a step than tasks of 8 (256
    tasks, ~10.5 us) in one process (benchmarks/results/h200-2026-12-02-v2-wide-profiles, call 3)."""
    for b, heads in ((2, 1), (8, 4)):
        if batch <= b:
            return min(heads, num_heads)
    return min(8, num_heads)


def visible_range(seq_len: int, window: int | None) -> tuple[int, int]:
    """Positions [start, seq_len) the new token attends to."""
    return (0 if not window else max(0, seq_len - window)), seq_len


def attn_live_tasks_for(batch: int) -> int:
    """The cap on a step's live attention tasks (schedule.StepShape's ``attn_live_tasks``; 0: off). At 8K
    history 128 splits of 3-5 tiles at batch 1 put a partial that waits on the layer's QKV on nearly every
    SM; 64 live tasks of at most 16 tiles, with each request's splits dealt last first (so that the up/gate
    wave's second round lands on SMs of empty splits), measured -3.5 / -3.2 / -3.6% a step at batch 1 at 8K /
    32K / 128K, -1.4% at batch 2, -1.8% at 4 and -0.4% at 8 (the kernel alone, one process each;
    benchmarks/results/h200-2026-12-03-v2-session-t, call 4). The cap alone, with the splits dealt in
    order, measured +1.7% at batch 1, the order alone +2.1%. Not measured above batch 8."""
    return ATTN_LIVE_TASKS if batch <= ATTN_LIVE_UP_TO_BATCH else 0


def combine_place_for(batch: int) -> str:
    """Where a layer's ATTN_COMBINE tasks go (schedule.StepShape's ``combine_place``). At batch 2 the cap's
    round-robin deal puts the combines on SMs that hold request 1's live splits, so they start behind those
    partials; on the SMs of the highest (at 8K empty) splits the step measured -3.0% at batch 2 (the kernel
    alone, one process, outputs bit-equal), -0.05% at batch 1 and +0.7% at batch 4
    (benchmarks/results/h200-2026-12-03-v2-session-u, call 1), so only batch 2 takes it."""
    return "empty_splits" if batch == 2 else "round_robin"


def local_routing_for(batch: int) -> bool:
    """Whether the expert tasks' producers choose the layer's experts themselves from the router's scores
    (schedule.StepShape's ``local_routing``) instead of waiting for the top-k task's work list: the top-k
    task and one barrier hop leave the routing chain, at the price of the same top-k on every SM that holds
    an expert place of the layer. Measured slower at every batch it can run at (the kernel alone, 8K, one
    process each, outputs bit-equal: +2.8 / +0.9 / +2.4 / +5.5% at batch 1 / 2 / 4 / 8; at batch 1 the experts
    started 3 us earlier and the attention chain ended later; benchmarks/results/h200-2026-12-04-v2-local-routing,
    call 1): off, a schedule choice to compare."""
    return False


def posted_routing_for(batch: int) -> bool:
    """Whether the top-k posts its work list as one self-flagged word a slot that the expert tasks' producers
    poll (schedule.StepShape's ``posted_routing``) instead of their waiting on its barrier and then reading the
    route buffer: the routing hop loses the top-k's fence and one round trip to L2. On at batch 1 to 4. The
    kernel alone at 8K, outputs bit-equal, one process a batch with an A/A control: on an H100 (session AN,
    benchmarks/results/h100-2026-12-05-session-an) -1.07% at batch 1 in call 1 (the control's rounds -0.69 ..
    -0.02%) and -2.00% in call 2 (rounds -3.05 .. -1.37%, the control's -0.56 .. +0.73%), -0.09% at batch 2
    (inside its control). On an H200 after the top-k's early post (session AR,
    benchmarks/results/h200-2026-12-06-session-ar, calls 11-13, with posted scores where they are on): turning it
    off cost +2.16 / +2.06% at batch 1 in two processes (every round above every control round); at batch 2
    -0.54 / -0.64% alone and -1.10 / -1.11% with posted scores (posted_scores_for), whose rounds sat below the
    control's in one process and overlapped them by 0.3 points in the other. Before the early post the H200 had
    measured it +0.19 / -0.11 / +0.25 / +0.30% at batch 1 / 2 / 4 / 8 (benchmarks/results/h200-2026-12-04-v2-
    session-ae, call 4), and turning it off -0.77% at batch 1 (session AO); batch 4 with posted scores -0.61%,
    inside its control's rounds (-1.29 .. +0.68%). Batch 3 and 4 with posted scores on an H100 (session AS,
    benchmarks/results/h100-2026-12-06-session-as, calls 22-23, PERF_LOG #201), two processes each: batch 3 -0.65 /
    -0.37%, batch 4 -0.51 / -0.36%, every round below main in all four (in the first process also below every
    control round); with the H200's -0.61% at batch 4, on at 3 and 4 since."""
    return batch <= 4


def stages_in_flight_for(batch: int) -> int:
    """How many of the producer's ring buffers may be in flight at once (schedule.StepShape's
    ``stages_in_flight``; STAGES: the whole ring, no cap). A fence (the signaller's; before session AD also the
    dependency wait's acquire) waits for every request its SM has in flight, the producer's copies included, and under a saturated
    HBM those answer behind the whole GPU's (L2 loads queue far less): the fence probe measured fence.acq_rel.gpu
    at 0.14 us idle, 1.0 us with 32 KB in flight on every SM, 2.2 us at 64 KB and 8.4 us at 160 KB (the whole
    ring), while HBM moved 4.14 / 4.62 / 4.68 TB/s. A latency-bound batch gains from a shallow cap; a
    bandwidth-bound one needs the depth. Measured, the kernel alone at 8K, one process a batch, outputs
    bit-equal (benchmarks/results/h200-2026-12-04-v2-session-ac): the whole ring against this choice +1.8% at
    batch 1 and +0.5% at 2 (call 2); from batch 3 to 16 no shallower cap was faster (calls 2 and 5; a cap of 3
    cost 1.1% at batch 3 and 2.5% at 16). With the waits' acquire loads (session AD, call 1) the whole ring still
    cost 2.3% at batch 1 and 0.5% at 2 against this choice."""
    return 2 if batch == 1 else 3 if batch == 2 else STAGES


def attn_live_splits_for(batch: int, live_tasks: int) -> int:
    """Live splits per request under a cap of ``live_tasks`` live attention tasks a step (0: no cap)."""
    return max(1, live_tasks // batch) if live_tasks else 0


def attn_split_tiles(seq_len: int, window: int | None, splits: int, min_tiles: int, live_splits: int = 0,
                     max_tiles: int = DEFAULT_ATTN_MAX_TILES) -> tuple[int, int, int]:
    """(first tile, tiles per split, splits in use) for a request: tiles are ATTN_TILE-token runs aligned to
    absolute positions; the visible tiles are cut into equal runs of at least ``min_tiles``, so a short
    context uses fewer splits and the rest return at once. With ``live_splits`` (0: off) a run is also
    long enough that at most that many splits are in use, unless that would take it past ``max_tiles``:
    a history short enough keeps its attention on fewer SMs, a long one still spreads over every split.
    Split s covers tiles [first + s * per, min(end, first + (s + 1) * per))."""
    start, end = visible_range(seq_len, window)
    if end <= start:
        return 0, 0, 0
    first, last = start // ATTN_TILE, -(-end // ATTN_TILE)
    n = last - first
    per = max(min_tiles, -(-n // splits))
    if live_splits:
        per = max(per, min(-(-n // live_splits), max_tiles))
    return first, per, -(-n // per)


# -- workspace


def moe_slots(dims, batch: int) -> int:
    """Expert slots per MoE layer: at most every expert, at most one per (token, k) pair."""
    return min(dims.num_experts, batch * dims.top_k)


def route_offsets(dims, batch: int) -> dict[str, int]:
    """int32 word offsets in the route buffer: num_active at 0, slot_expert[slots], slot_count[slots],
    slot_rows[slots][batch] (the (token * K + k) rows of each slot's expert, ascending), then every layer's
    num_active (layer_active[num_layers]): the rest is rewritten by each layer's top-k, these words are not,
    so a producer that reaches a layer's expert place late still reads that layer's count."""
    slots = moe_slots(dims, batch)
    rows_end = 1 + 2 * slots + slots * batch
    return {"expert": 1, "count": 1 + slots, "rows": 1 + 2 * slots, "layer_active": rows_end,
            "size": rows_end + dims.num_layers}


def posted_scores_for(batch: int) -> bool:
    """Whether each ROUTER task also posts its scores as the top-k's ranking keys and the top-k polls them
    (schedule.StepShape's ``posted_scores``) instead of waiting on the router wave's barrier: the routing hop
    loses the routers' fences and signals, the barrier's round trip and the top-k's second read of the scores.
    On at batch 1 to 4. The kernel alone at 8K, outputs bit-equal, each process with an A/A control. On an H100
    (session AQ, benchmarks/results/h100-2026-12-06-session-aq, PERF_LOG #190): batch 1 -0.69% (rounds -1.89 ..
    -0.51%, the control's -0.18 .. +0.41%) and -1.41% (-2.46 .. -1.25%; control -0.58 .. +0.19%) in two processes,
    -0.7% in kernel_profile; batch 2 -0.27% with the top-k's barrier (a form since refused: schedule.StepShape) and
    -0.52% with posted routing, both inside the control's rounds (-0.25 .. +2.51%). On an H200 (session AR,
    benchmarks/results/h200-2026-12-06-session-ar, PERF_LOG #191): batch 1 without them -0.08 / -0.22%, inside the
    spread between main and its control; batch 2 with posted routing -1.10 / -1.11% against main's barrier path
    (posted routing alone -0.54 / -0.64%); batch 4 -0.61% with posted routing (inside the control). Batch 3 and 4 on
    an H100 with posted routing (session AS, PERF_LOG #201): -0.65 / -0.37% and -0.51 / -0.36% in two processes
    (posted_routing_for).
    Only with posted routing (StepShape refuses it without)."""
    return batch <= 4


def score_post_words(dims, batch: int) -> int:
    """The posted score keys of a step (uint32, one a score: [num_layers][batch][num_experts]; StepShape.posted_scores),
    in the step's barrier array after the posted route words, so that the host's zeroing of the barriers before
    every launch clears them too: a key is never 0 (abi.STEP_FIELDS' ``score_posts``), so 0 is "not posted"."""
    return dims.num_layers * batch * dims.num_experts


def route_post_words(dims, batch: int) -> int:
    """The posted route words of a step (uint64, abi.ROUTE_POST): per layer its routed slot count, then one word
    per slot (StepShape.posted_routing). They live in the step's barrier array, after the barriers, so that the
    host's zeroing of the barriers before every launch clears them too."""
    return dims.num_layers * (1 + moe_slots(dims, batch))


def workspace_spec(dims, batch: int, splits: int, moe_intermediate: int, dense_intermediate: int
                   ) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every workspace buffer of a ``batch``-row step: name -> (shape, dtype name). x, o and mlp hold two
    layers (layer l writes index l % 2, reads (l - 1) % 2), so a layer's readers of the previous residual
    never race its writers. The router's scores are kept for every layer (written once a step), so a producer that
    reaches a layer's expert place late still reads that layer's scores (StepShape.local_routing)."""
    B, H, D = batch, dims.hidden, dims.head_dim
    Hq, K, E = dims.num_heads, dims.top_k, dims.num_experts
    return {
        "x": ((2, B, H), "bf16"), "hn": ((B, H), "bf16"), "q": ((B, Hq, D), "bf16"),
        "opart": ((B, splits, Hq, D), "f32"), "lse": ((B, splits, Hq), "f32"), "attn": ((B, Hq * D), "bf16"),
        "o": ((2, B, H), "bf16"), "mlp": ((2, B, H), "bf16"), "out": ((B, H), "bf16"),
        "scores": ((dims.num_layers, B, E), "f32"), "topk_w": ((B, K), "f32"), "route": ((route_offsets(dims, B)["size"],), "i32"),
        "dact": ((B, max(dense_intermediate, 8)), "bf16"), "act": ((B * K, moe_intermediate), "bf16"),
        "eout": ((B * K, H), "bf16"),
    }


def model_mismatches(dims, moe_intermediate: int, dense_intermediate: int) -> list[str]:
    """How a model differs from the shape the kernel is compiled for (empty: it fits). The dense FFN width
    counts only for a model with a dense layer: without one no dense task is built, so its width is unused
    (``benchmarks.attention_bench`` runs such a model, MoE layers only)."""
    have = {"hidden": dims.hidden, "num_heads": dims.num_heads, "num_kv_heads": dims.num_kv_heads,
            "head_dim": dims.head_dim, "num_experts": dims.num_experts, "top_k": dims.top_k,
            "moe_intermediate": moe_intermediate, "dense_intermediate": dense_intermediate}
    used = [k for k in MODEL if k != "dense_intermediate" or any(dims.dense)]
    return [f"{k}={have[k]} (the kernel is compiled for {MODEL[k]})" for k in used if have[k] != MODEL[k]]


__all__ = [
    "ATTN_TILE", "GemmTiles", "attn_live_splits_for", "attn_live_tasks_for", "attn_split_tiles", "attn_splits_for",
    "combine_heads_for", "combine_place_for", "compiled_stage_rows", "local_routing_for", "posted_routing_for",
    "posted_scores_for", "route_post_words", "score_post_words", "stages_in_flight_for",
    "fold_norm", "gemm_tiles", "model_mismatches", "moe_slots", "padded_rows", "route_offsets", "rows_per_stage",
    "visible_range", "workspace_spec",
]

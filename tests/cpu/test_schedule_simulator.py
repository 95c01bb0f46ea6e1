"""The schedule, proven on the CPU: exact barrier counts, no deadlock under any interleaving, every
conflicting access ordered, and the step computed task by task equal to the reference decode step."""

import dataclasses
import itertools
import json

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import FULL_CONFIG, TINY_CONFIG
from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel import abi, layout, simulate
from vllm_megakernel.megakernel.abi import NO_BARRIER, Op
from vllm_megakernel.megakernel.layout import moe_slots
from vllm_megakernel.megakernel.schedule import MOE_ONLY_WAVES, WAVE_ORDERS, Barrier, StepShape, Task, build_schedule
from vllm_megakernel.paged_kv import PagedKVSim

TINY_I, TINY_DENSE_I = 32, 96  # intermediate_size, prefix_dense_intermediate_size of the tiny config

# The routing hop through the top-k's barrier and the route buffer, not its posted words (batch 2's default until
# session AR, PERF_LOG #194), for the tests that pin that form's waits, deadlocks and races.
BARRIER_ROUTED = dict(posted_routing=False)


@pytest.fixture(scope="module")
def dims():
    return ref.ModelDims.from_config(TINY_CONFIG)


def tiny_schedule(dims, batch, num_sms=5, splits=2, **shape):
    return build_schedule(dims, StepShape(batch=batch, num_sms=num_sms, attn_splits=splits, attn_min_tiles=1,
                                          **shape), TINY_I, TINY_DENSE_I)


@pytest.mark.parametrize("batch", [1, 3, 8, 20])
@pytest.mark.parametrize("order", ["round_robin", "random", "reverse"])
def test_every_barrier_reaches_exactly_its_target(dims, batch, order):
    s = tiny_schedule(dims, batch)
    done = simulate.run(s, order=order, seed=batch)
    assert sorted(done) == list(range(len(s.tasks)))


@pytest.mark.parametrize("batch", [1, 3, 20])
def test_no_two_conflicting_tasks_are_unordered(dims, batch):
    simulate.check_races(tiny_schedule(dims, batch))


def layer_waves(s, layer):
    waves = []
    for t in s.tasks:
        if t.layer == layer and (not waves or waves[-1] != t.wave):
            waves.append(t.wave)
    return waves


def test_waves_follow_the_named_order_within_a_layer(dims):
    s = tiny_schedule(dims, 2)
    assert layer_waves(s, 1) == ["router", "qkv", "router_topk", "attn_partial", "mlp_up", "attn_combine",
                                 "mlp_down", "o_proj", "moe_combine"]
    assert layer_waves(s, 0) == ["qkv", "attn_partial", "mlp_up", "attn_combine", "mlp_down", "o_proj"]
    assert layer_waves(s, dims.num_layers) == ["final_norm"]
    assert {t.sm for t in s.tasks} == set(range(5))  # round-robin reaches every SM


@pytest.mark.parametrize("order", sorted(WAVE_ORDERS))
def test_every_named_wave_order_is_a_complete_race_free_schedule(dims, weights, order):
    """The wave orders kernel_profile compares: each lays a layer's waves out as named, deadlock-free under
    any interleaving, race-free, and computes the same step."""
    s = build_schedule(dims, StepShape(batch=3, num_sms=5, attn_splits=2, attn_min_tiles=1, order=order),
                       TINY_I, TINY_DENSE_I)
    assert layer_waves(s, 1) == list(WAVE_ORDERS[order])
    assert layer_waves(s, 0) == [w for w in WAVE_ORDERS[order] if w not in MOE_ONLY_WAVES]
    simulate.run(s, order="random", seed=3)
    simulate.check_races(s)
    sim = PagedKVSim(dims, num_requests=3, max_len=40, block_size=4, seed=5)
    sim.fill_history([30, 9, 0], generator=torch.Generator().manual_seed(5))
    inp = sim.step([7, 8, None])
    base = build_schedule(dims, StepShape(batch=3, num_sms=5, attn_splits=2, attn_min_tiles=1), TINY_I, TINY_DENSE_I)
    torch.testing.assert_close(simulate.decode_step(s, weights, clone_inputs(inp)),
                               simulate.decode_step(base, weights, clone_inputs(inp)), atol=0, rtol=0)


def test_small_batches_fold_the_norm_and_large_ones_run_a_norm_wave(dims):
    """No single-SM norm task on a layer's critical path at small batches: the qkv / router / dense up
    tasks compute it (one of each wave stores x or hn); from layout.WIDE_FROM_BATCH a norm wave of row
    chunks runs first and everyone reads hn."""
    small = tiny_schedule(dims, layout.WIDE_FROM_BATCH - 1)
    assert not any(t.op == Op.NORM and t.layer < dims.num_layers for t in small.tasks)
    for layer in (0, 1):
        qkv = [t for t in small.tasks if t.layer == layer and t.op == Op.QKV_ROPE]
        assert all(t.fields["norm"] for t in qkv) and sum(t.fields["write_x"] for t in qkv) == 1
    routers = [t for t in small.tasks if t.layer == 1 and t.op == Op.ROUTER]
    assert sum(t.fields["write_hn"] for t in routers) == 1
    big = tiny_schedule(dims, layout.WIDE_FROM_BATCH)
    norms = [t for t in big.tasks if t.layer == 1 and t.op == Op.NORM]
    assert len(norms) == 2 and sum(t.fields["rows"] for t in norms) == layout.WIDE_FROM_BATCH
    assert not any(t.fields.get("norm") for t in big.tasks if t.op != Op.NORM)


def test_barrier_targets_are_derived_from_the_schedule(dims):
    B, K = 3, dims.top_k
    s = tiny_schedule(dims, B, splits=2)
    by_name = {b.name: b.target for b in s.barriers}
    tiles = s.tiles
    qkv_rows = (dims.num_heads + 2 * dims.num_kv_heads) * dims.head_dim
    assert by_name["L1.qkv"] == qkv_rows // tiles.qkv_rows
    assert by_name["L1.router"] == dims.num_experts // tiles.router_rows
    assert by_name["L1.route"] == 1
    assert by_name["L1.attn"] == B * 2  # one per (request, split)
    assert by_name["L1.attn_combine"] == B * dims.num_heads // s.combine_heads
    assert by_name["L1.moe_up.s0"] == TINY_I // tiles.moe_up_cols
    assert by_name["L1.moe_down"] == moe_slots(dims, B) * dims.hidden // tiles.moe_down_rows
    assert moe_slots(dims, B) == min(dims.num_experts, B * K)
    assert by_name["L0.dense_up"] == TINY_DENSE_I // tiles.dense_up_cols


def test_the_producer_waits_only_on_barriers_of_earlier_tasks(dims):
    """Expert tasks stream their expert's weights after the layer's routing, and the attention task the
    new token's K/V after the layer's qkv; pointing a producer wait at a later barrier is refused."""
    s = tiny_schedule(dims, 2, **BARRIER_ROUTED)
    route = {t.layer: t.signal for t in s.tasks if t.op == Op.ROUTER_TOPK}
    for t in s.tasks:
        if t.op in (Op.MOE_UPGATE, Op.MOE_DOWN):
            assert t.load_wait == route[t.layer]
        elif t.op == Op.ATTN_PARTIAL:
            assert t.load_wait == t.waits[0]
        else:
            assert t.load_wait == NO_BARRIER
    victim = next(t for t in s.tasks if t.op == Op.MOE_UPGATE and t.layer == 1)
    victim.load_wait = next(t.signal for t in s.tasks if t.op == Op.O_PROJ and t.layer == 1)
    with pytest.raises(simulate.Deadlock, match="the producer of task"):
        simulate.run(s)


def test_a_missing_signal_is_reported_as_a_deadlock_naming_the_barrier(dims):
    s = tiny_schedule(dims, 2)
    victim = next(t for t in s.tasks if t.op == Op.MOE_UPGATE and t.layer == 2)
    victim.signal = NO_BARRIER  # the target stays, one arrival goes missing
    n = TINY_I // s.tiles.moe_up_cols
    with pytest.raises(simulate.Deadlock, match=rf"waits on L2\.moe_up\.s0: expected {n}, seen {n - 1}"):
        simulate.run(s)


def test_a_missing_routing_signal_stops_the_producers_and_the_report_says_so(dims):
    """Expert places are claimed by the producer once the layer's routing is published; without it no
    producer gets past its first expert place, and the deadlock report names the producer's wait."""
    s = tiny_schedule(dims, 2, **BARRIER_ROUTED)
    topk = next(t for t in s.tasks if t.op == Op.ROUTER_TOPK and t.layer == 2)
    topk.signal = NO_BARRIER
    with pytest.raises(simulate.Deadlock, match=r"the producer of SM \d+ waits on L2\.route before publishing"):
        simulate.run(s)


@pytest.mark.parametrize("order", ["round_robin", "reverse", "random"])
def test_producers_run_at_most_the_descriptor_ring_ahead_and_claim_in_reach_order(dims, order):
    """However far the producers run ahead (up to the ring, or only to the consumer's place), every claim
    wave is handed out whole, each task once, and the step completes with exact barrier counts."""
    s = tiny_schedule(dims, 3, num_sms=3)
    placed = []
    done = simulate.run(s, order=order, seed=7, placed=placed)
    assert sorted(done) == list(range(len(s.tasks)))
    for counter in {t.claim for t in s.tasks if t.claim != NO_BARRIER}:
        wave = sorted(t.index for t in s.tasks if t.claim == counter)
        ran = sorted(i for lst in placed for i in lst if s.tasks[i].claim == counter)
        assert ran == wave


def test_an_extra_signal_is_reported_as_overflow(dims):
    s = tiny_schedule(dims, 2)
    qkv_bar = next(t.signal for t in s.tasks if t.op == Op.QKV_ROPE and t.layer == 3)
    extra = next(t for t in s.tasks if t.op == Op.O_PROJ and t.layer == 3)
    extra.signal = qkv_bar
    s.barriers[next(t.signal for t in s.tasks if t.op == Op.O_PROJ and t.layer == 3 and t is not extra)].target -= 1
    with pytest.raises((simulate.BarrierOverflow, simulate.Deadlock)):
        simulate.run(s)


def test_a_dropped_dependency_is_caught_as_a_race(dims):
    s = tiny_schedule(dims, 2, **BARRIER_ROUTED)
    combine = next(t for t in s.tasks if t.op == Op.MOE_COMBINE and t.layer == 2)
    combine.waits = ()  # would read expert outputs before they are written
    with pytest.raises(simulate.RaceError, match="eout"):
        simulate.check_races(s)


def _moe_layers(s):
    return sorted({t.layer for t in s.tasks if t.op == Op.MOE_UPGATE})


def test_expert_rows_read_by_this_layer_unordered_with_the_next_layers_writes_are_a_race(dims):
    """act and eout rows are a token's k-th choice, held by whichever slot routes them that layer: a down
    tile of one MoE layer that reads act with nothing ordering it before the next MoE layer's up/gate tiles
    (here an extra tile, last on its SM, signalling nothing) races with them even when no other task uses
    its slot key (99), so that the per-region check sees no conflict."""
    s = tiny_schedule(dims, 2, expert_claims=False)
    layer = _moe_layers(s)[0]
    down = next(t for t in s.tasks if t.op == Op.MOE_DOWN and t.layer == layer)
    late = dataclasses.replace(down, index=len(s.tasks), signal=NO_BARRIER, reads=(("act", 99),), writes=(),
                               fields=dict(down.fields))
    s.tasks.append(late)
    s.sm_tasks[late.sm].append(late.index)
    with pytest.raises(simulate.RaceError, match="touch act unordered"):
        simulate.check_races(s)
    late.layer = _moe_layers(s)[-1]  # the same task in the last MoE layer has no next layer to race with
    simulate.check_races(s)


def _extra_expert_task(s, layer, op, reads=(), writes=(), at=None):
    """A task of ``op`` in ``layer`` that waits on and signals nothing, on an SM of its own list's choosing:
    at the end of SM 0's list, or at position ``at`` of it."""
    t = Task(len(s.tasks), op, layer, "extra", {"slot": 0}, (), NO_BARRIER, reads, writes, sm=0)
    s.tasks.append(t)
    s.sm_tasks[0].insert(len(s.sm_tasks[0]) if at is None else at, t.index)
    return t


def test_a_skipped_tile_orders_nothing_even_where_it_sits_in_its_sms_list(dims):
    """A dead slot's down tile keeps its place in its SM's list but never runs: a task just before it on that
    SM is not ordered before the MoE combine by it (a write the combine reads races on a step where that
    slot is dead, and not on one where it is live)."""
    s = tiny_schedule(dims, 2, num_sms=40, expert_claims=False)
    layer = _moe_layers(s)[0]
    last = s.num_slots - 1
    down = next(t for t in s.tasks if t.op == Op.MOE_DOWN and t.layer == layer and t.fields["slot"] == last)
    w = Task(len(s.tasks), Op.NORM, layer, "extra", {}, (), NO_BARRIER, (), (("ww",),), sm=down.sm)
    s.tasks.append(w)
    lst = s.sm_tasks[down.sm]
    lst.insert(lst.index(down.index), w.index)
    next(t for t in s.tasks if t.op == Op.MOE_COMBINE and t.layer == layer).reads += (("ww",),)
    simulate.check_races(s)
    with pytest.raises(simulate.RaceError, match="ww"):
        simulate.check_races(s, live_slots=lambda layer: last)


def test_a_task_after_a_skipped_tile_keeps_what_the_task_before_it_knew(dims):
    """Program order runs through a skipped tile: the task after it on its SM is ordered after whatever the
    task before it waited for (here a write on another SM), not only after its own SM's earlier tasks."""
    s = tiny_schedule(dims, 2, num_sms=40, expert_claims=False)
    layer = _moe_layers(s)[0]
    last = s.num_slots - 1
    down = next(t for t in s.tasks if t.op == Op.MOE_DOWN and t.layer == layer and t.fields["slot"] == last)
    b = len(s.barriers)
    s.barriers.append(Barrier("extra", 1))
    writer = Task(len(s.tasks), Op.NORM, layer, "extra", {}, (), b, (), (("w2",),), sm=len(s.sm_tasks))
    before = Task(len(s.tasks) + 1, Op.NORM, layer, "extra", {}, (b,), NO_BARRIER, (), (), sm=down.sm)
    after = Task(len(s.tasks) + 2, Op.NORM, layer, "extra", {}, (), NO_BARRIER, (("w2",),), (), sm=down.sm)
    s.tasks += [writer, before, after]
    s.sm_tasks.append([writer.index])
    lst = s.sm_tasks[down.sm]
    k = lst.index(down.index)
    lst[k:k + 1] = [before.index, down.index, after.index]
    simulate.check_races(s)
    simulate.check_races(s, live_slots=lambda layer: last)


def test_expert_rows_written_by_this_layer_unordered_with_the_next_layers_reads_are_a_race(dims):
    """The other direction of the check across layers: an expert task of the next MoE layer that reads act
    (here one at the head of SM 0's list, before anything of this layer) races with this layer's up/gate
    tiles writing it, whatever its slot key."""
    s = tiny_schedule(dims, 2, expert_claims=False)
    _extra_expert_task(s, _moe_layers(s)[1], Op.MOE_DOWN, reads=(("act", 99),), at=0)
    with pytest.raises(simulate.RaceError, match="touch act unordered"):
        simulate.check_races(s)


def test_expert_outputs_read_by_this_layer_unordered_with_the_next_layers_writes_are_a_race(dims):
    """eout's rows move between slots as act's do: a read of eout by an expert task of one MoE layer that
    nothing orders before the next layer's down tiles races with them."""
    s = tiny_schedule(dims, 2, expert_claims=False)
    _extra_expert_task(s, _moe_layers(s)[0], Op.MOE_DOWN, reads=(("eout", 99),))
    with pytest.raises(simulate.RaceError, match="touch eout unordered"):
        simulate.check_races(s)


def test_a_task_ordered_after_everything_before_another_but_not_after_it_is_unordered(dims):
    """The boundary of the check across layers: a task that knows the first ``pos`` tasks of an SM's list is
    ordered after the one at ``pos - 1`` but not after the one at ``pos``."""
    s = tiny_schedule(dims, 1)
    hb = SimpleNamespace(sm=np.array([0, 1]), pos=np.array([3, 0]), clock=np.array([[0, 0], [3, 0]]))
    hb.ordered = lambda a, b: bool(hb.clock[b, hb.sm[a]] > hb.pos[a])
    with pytest.raises(simulate.RaceError, match="touch act unordered"):
        simulate._all_ordered(s, hb, "act", [0], [1])
    hb.clock[1, 0] = 4
    simulate._all_ordered(s, hb, "act", [0], [1])


def test_a_split_that_waited_does_not_stand_for_the_split_that_had_work(dims):
    """A barrier of attention splits passes on what the least informed split knew after its waits, not the
    most: one split waiting on a task says nothing of the others, and the split that waited may be the one
    with no work, which skips its waits."""
    s = tiny_schedule(dims, 2, expert_claims=False)
    x = len(s.barriers)
    s.barriers.append(Barrier("extra", 1))
    t = Task(len(s.tasks), Op.NORM, 0, "extra", {}, (), x, (), (("zz",),), sm=len(s.sm_tasks))
    s.tasks.append(t)
    s.sm_tasks.append([t.index])  # an SM of its own: no program order ties it to anything
    split = next(t for t in s.tasks if t.op == Op.ATTN_PARTIAL and t.layer == 1)
    split.waits += (x,)
    combine = next(t for t in s.tasks if t.op == Op.ATTN_COMBINE and t.layer == 1)
    combine.reads += (("zz",),)
    with pytest.raises(simulate.RaceError, match="zz"):
        simulate.check_races(s)


def test_race_check_orders_tasks_after_the_attention_wave_on_more_sms_than_tasks(dims):
    """Every layer has a live request whose split with its newest token waits for the layer's QKV, so the
    tasks after the attention wave are ordered after the QKV wave; on 40 SMs (fewer tasks a layer than SMs)
    program order does not order them, and treating every split as possibly empty raised a false race
    between two layers' QKV tasks."""
    for batch in (1, 2, 8):
        simulate.check_races(tiny_schedule(dims, batch, num_sms=40))
    simulate.check_races(tiny_schedule(dims, 2, num_sms=40), live_slots=lambda layer: 1)


@pytest.mark.parametrize("batch, claims, order", [(1, True, "round_robin"), (3, True, "random"),
                                                  (3, False, "reverse"), (8, True, "random")])
@pytest.mark.parametrize("live", [0, 1, 2])
def test_steps_with_dead_slots_are_race_free(dims, batch, claims, order, live):
    """With only ``live`` slots routed, the dead slots' expert tasks neither run nor signal and the top-k
    signals for their down tiles: every conflicting access is still ordered. With none live (not a real step)
    the MoE combine is ordered after the top-k's route and weights only through that stand-in signal."""
    s = tiny_schedule(dims, batch, expert_claims=claims)
    assert s.num_slots > live
    simulate.check_races(s, order=order, seed=batch, live_slots=lambda layer: live)


@pytest.mark.parametrize("claims", [False, True])
def test_an_ordering_that_held_only_through_a_dead_slots_task_is_a_race(dims, claims):
    """The last slot's down tiles are made to wait on the layer's attention and the MoE combine to read the
    attention's partials: ordered while every slot is live, but on a step where the last slot is dead its
    tiles are skipped and the top-k's stand-in signal orders the combine after no attention task. The
    combine is moved to run right after slot 0's down tile on that tile's SM, where nothing before it in
    program order follows the attention wave. With claims the skipped tiles go back at the end of their SMs'
    lists (claims_resolved), where, were they still counted as signallers, their places would order the
    combine after everything on those SMs."""
    s = tiny_schedule(dims, 2, num_sms=40, expert_claims=claims)
    layer = _moe_layers(s)[0]
    attn = next(t for t in s.tasks if t.op == Op.ATTN_PARTIAL and t.layer == layer)
    last = s.num_slots - 1
    for t in s.tasks:
        if t.op == Op.MOE_DOWN and t.layer == layer and t.fields["slot"] == last:
            t.waits += (attn.signal,)
    combine = next(t for t in s.tasks if t.op == Op.MOE_COMBINE and t.layer == layer)
    combine.reads += (("opart",),)
    first = next(t for t in s.tasks if t.op == Op.MOE_DOWN and t.layer == layer and t.fields["slot"] == 0)
    s.sm_tasks[combine.sm].remove(combine.index)
    lst = s.sm_tasks[first.sm]
    lst.insert(lst.index(first.index) + 1, combine.index)
    combine.sm = first.sm
    simulate.check_races(s)
    simulate.check_races(s, live_slots=lambda layer: s.num_slots)
    with pytest.raises(simulate.RaceError, match="opart"):
        simulate.check_races(s, live_slots=lambda layer: last)


@pytest.mark.parametrize("batch, live, order, shape", [
    (1, 8, "round_robin", {}), (2, 12, "reverse", {"local_routing": True}), (8, 40, "random", {}),
    (16, 70, "random", {}), (64, 100, "random", {})])
def test_the_full_model_step_on_132_sms_is_race_free_with_claims_and_dead_slots(batch, live, order, shape):
    """North Mini Code's own schedule at the H200's SM count, as vLLM launches it: claims resolved by one
    order of SMs, ``live`` of its slots routed (batch 1 always routes its 8; batch 8 about 51 of 64). Batch 16
    deals the O projection among the down tiles and batch 64 folds the MoE combine into the next norm and
    splits the QKV and O tiles by batch rows (their defaults); batch 2 runs local routing. Batch 64 takes ~35 s."""
    config = json.loads((FULL_CONFIG / "config.json").read_text())
    full = ref.ModelDims.from_config(config)
    s = build_schedule(full, StepShape(batch=batch, num_sms=132, **shape), config["intermediate_size"],
                       config["prefix_dense_intermediate_size"])
    assert s.num_slots >= live and any(t.claim != NO_BARRIER for t in s.tasks)
    simulate.check_races(s, order=order, seed=batch, live_slots=lambda layer: live)


def test_tasks_placed_out_of_topological_order_deadlock(dims):
    s = tiny_schedule(dims, 1, num_sms=1)
    lst = s.sm_tasks[0]
    i = next(k for k, t in enumerate(lst) if s.tasks[t].op == Op.ATTN_PARTIAL)
    j = next(k for k, t in enumerate(lst) if s.tasks[t].op == Op.QKV_ROPE)
    lst[i], lst[j] = lst[j], lst[i]  # an attention slice before the qkv it waits on, on the only SM
    with pytest.raises(simulate.Deadlock):
        simulate.run(s)


@pytest.fixture(scope="module")
def weights(tiny_checkpoint, dims):
    return ref.Weights.from_checkpoint(tiny_checkpoint, dims, dtype=torch.float32)


def clone_inputs(inp):
    return dataclasses.replace(inp, kv_caches=[c.clone() for c in inp.kv_caches])


def step_inputs(dims, lengths, seed):
    """One decode step's inputs over histories of ``lengths`` (4-token blocks), random new tokens."""
    gen = torch.Generator().manual_seed(seed)
    sim = PagedKVSim(dims, num_requests=len(lengths), max_len=max(lengths) + 1, block_size=4, seed=seed)
    sim.fill_history(lengths, generator=gen)
    return sim.step([int(torch.randint(0, dims.vocab, (1,), generator=gen)) for _ in lengths])


def assert_race_free_and_bit_equal(sched, other, weights, inp, order, seed):
    """``sched`` is race-free and computes exactly what ``other`` (the same tasks placed otherwise) computes."""
    simulate.check_races(sched, order=order, seed=seed)
    got = simulate.decode_step(sched, weights, clone_inputs(inp), order=order, seed=seed)
    want = simulate.decode_step(other, weights, clone_inputs(inp), order=order, seed=seed)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("batch, splits, order, claims", [(1, 1, "round_robin", True), (4, 3, "random", True),
                                                          (4, 3, "random", False), (5, 2, "reverse", True),
                                                          (19, 2, "random", True)])
def test_step_through_schedule_matches_reference(dims, weights, batch, splits, order, claims):
    """Ragged lengths (below, at and above the window), one padding row, KV written through the cache;
    batch 19 runs the norm wave instead of the folded norm and the GEMMs' grouped form. With claims the
    expert tasks run wherever a random (or reversed) order of SMs claimed them."""
    gen = torch.Generator().manual_seed(batch * 10 + splits)
    window = dims.sliding_window
    lengths = [1, window, window + 1, 3 * window + 2] * 5
    lengths = lengths[: batch - 1] if batch > 1 else [2 * window + 3]
    sim = PagedKVSim(dims, num_requests=batch, max_len=max(lengths) + 1, block_size=4, seed=batch)
    # fill each request's history with the reference, one token at a time
    for step in range(max(lengths)):
        toks = [int(torch.randint(0, dims.vocab, (1,), generator=gen)) if step < n else None for n in lengths]
        toks += [None] * (batch - len(toks))
        ref.decode_step(dims, weights, sim.step(toks))
    # the step under test: every live request gets one token, the last row is padding when batch > 1
    toks = [int(torch.randint(0, dims.vocab, (1,), generator=gen)) for _ in lengths]
    toks += [None] * (batch - len(toks))
    inp = sim.step(toks)
    ref_inp, mk_inp = clone_inputs(inp), clone_inputs(inp)
    expected = ref.decode_step(dims, weights, ref_inp)
    sched = build_schedule(dims, StepShape(batch=batch, num_sms=7, attn_splits=splits, attn_min_tiles=1,
                                           expert_claims=claims), *weights.intermediates())
    got = simulate.decode_step(sched, weights, mk_inp, order=order, seed=splits)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for a, b in zip(ref_inp.kv_caches, mk_inp.kv_caches):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, equal_nan=True)  # same K/V, same slots
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("claims, order", [(True, "random"), (True, "reverse"), (False, "round_robin")])
def test_down_tiles_that_do_not_divide_hidden_cut_each_slots_last_tile_and_match_the_reference(dims, weights,
                                                                                                claims, order):
    """moe_down_rows asked for need not divide hidden (64 here: tiles of 48 rows and a last one of 16): every
    task of the down wave carries the width, the last tile of a slot is cut at hidden, claims number
    ceil(hidden / width) tiles a slot, the top-k makes up as many per dead slot, and the step matches the
    reference under claims in any SM order, race-free, with dead slots skipped."""
    batch = 3
    gen = torch.Generator().manual_seed(4)
    lengths = [5, 9, 2]
    sim = PagedKVSim(dims, num_requests=batch, max_len=max(lengths) + 1, block_size=4, seed=batch)
    sim.fill_history(lengths, generator=gen)
    inp = sim.step([int(torch.randint(0, dims.vocab, (1,), generator=gen)) for _ in lengths])
    shape = StepShape(batch=batch, num_sms=5, attn_splits=2, attn_min_tiles=1, expert_claims=claims,
                      tiles=(("moe_down_rows", 48),))
    sched = build_schedule(dims, shape, *weights.intermediates())
    assert sched.tiles.moe_down_rows == 48 and layout.slot_tiles(dims.hidden, 48) == 2
    layer = next(i for i in range(dims.num_layers) if not dims.dense[i])
    down = [t for t in sched.tasks if t.layer == layer and t.op == Op.MOE_DOWN]
    assert {t.fields["rows"] for t in down} == {48} and sorted({t.fields["row0"] for t in down}) == [0, 48]
    assert len(down) == 2 * moe_slots(dims, batch)
    topk = next(t for t in sched.tasks if t.layer == layer and t.op == Op.ROUTER_TOPK)
    assert topk.fields["down_tiles"] == 2
    simulate.check_races(sched, order=order, seed=3)
    expected = ref.decode_step(dims, weights, clone_inputs(inp))
    got = simulate.decode_step(sched, weights, clone_inputs(inp), order=order, seed=3)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_down_tiles_take_the_cap_at_batch_5_to_8_and_divide_hidden_elsewhere_unless_asked():
    """layout.gemm_tiles: batch 5-8 take the partial buffer's cap (192 rows, a slot's last tile cut at
    hidden); other batches' default down tile divides hidden; one asked for is the largest whole-stage
    size within it and the cap, dividing or not. Other fields still divide."""
    from vllm_megakernel.megakernel.layout import gemm_tiles

    full = ref.ModelDims.from_config(FULL_CONFIG)
    assert [gemm_tiles(full, 768, 0, b).moe_down_rows for b in (1, 2, 4, 5, 8, 9, 16, 64)] == \
        [128, 128, 128, 192, 192, 64, 64, 64]  # 192: 10 tiles and one of 128; 96 cap from batch 9
    assert gemm_tiles(full, 768, 0, 8, {"moe_down_rows": 128}).moe_down_rows == 128
    assert gemm_tiles(full, 768, 0, 4, {"moe_down_rows": 192}).moe_down_rows == 192
    assert gemm_tiles(full, 768, 0, 16, {"moe_down_rows": 128}).moe_down_rows == 96  # the cap at 16 rows
    assert gemm_tiles(full, 768, 0, 8, {"moe_up_cols": 80}).moe_up_cols == 64  # up/gate: divisors only


@pytest.mark.parametrize("shape", [dict(batch=1, num_sms=6), dict(batch=3, num_sms=5, attn_splits=2),
                                   dict(batch=17, num_sms=7, expert_claims=True), dict(batch=40, num_sms=9)])
def test_encoding_is_every_task_through_abi_encode_in_its_sm_list(dims, shape):
    """Schedule.encode writes the words column by column: the same tensor as abi.encode task by task, each SM's
    list in execution order and padded with END rows."""
    from vllm_megakernel.megakernel.abi import TASK_WORDS, encode

    s = build_schedule(dims, StepShape(**shape), TINY_I, TINY_DENSE_I)
    longest = max(map(len, s.sm_tasks))
    want = torch.zeros(len(s.sm_tasks), longest + 1, TASK_WORDS, dtype=torch.int32)
    for sm, indices in enumerate(s.sm_tasks):
        for k, i in enumerate(indices):
            t = s.tasks[i]
            load = (t.load_wait, s.barriers[t.load_wait].target) if t.load_wait != NO_BARRIER else (NO_BARRIER, 0)
            want[sm, k] = torch.tensor(encode(t.op, t.layer, [(b, s.barriers[b].target) for b in t.waits], t.signal,
                                              t.index, load, **t.fields))
    assert torch.equal(s.encode(), want)


def test_full_model_schedule_at_batch_1_is_consistent():
    """North Mini Code itself: 49 layers, 132 SMs -- counts, deadlock freedom, races, the ABI encoding."""
    full = ref.ModelDims.from_config(FULL_CONFIG)
    s = build_schedule(full, StepShape(batch=1, num_sms=132), 768, 3072)
    simulate.run(s, order="random", seed=0)
    simulate.check_races(s)
    enc = s.encode()
    assert enc.shape[0] == 132 and enc.shape[2] == 32
    assert int((enc[:, :, 0] != 0).sum()) == len(s.tasks)
    per_layer = sum(1 for t in s.tasks if t.layer == 5)
    # router 128/8 + qkv 5120/64 (together 96 tasks, each on an SM of its own, PERF_LOG #51) + top-k 1 +
    # attention 128 splits + up 8 experts * 768/32 + down 8 * 2048/128 + combine 32 heads + o 2048/16 + moe
    # combine 2048/128
    assert s.shape.attn_splits == 128 and s.combine_heads == 1
    assert per_layer == 16 + 80 + 1 + 128 + 8 * 24 + 8 * 16 + 32 + 128 + 16
    head = [t for t in s.tasks if t.layer == 5 and t.wave in ("router", "qkv")]
    assert len(head) == 96 and len({t.sm for t in head}) == 96
    # one task per stage-aligned row run: the tiles are whole stages of the compiled row lengths
    for name, rows in layout.compiled_stage_rows().items():
        assert rows in (4, 8, 16), name


def test_replaying_the_reference_routing_reproduces_it(dims, weights):
    """forced_experts (how GPU tests replay the kernel's expert choice) with the reference's own choice
    changes nothing."""
    sim = PagedKVSim(dims, num_requests=3, max_len=12, block_size=4, seed=1)
    sim.fill_history([5, 9, 2], generator=torch.Generator().manual_seed(1))
    inp = sim.step([3, 4, 5])
    routing = {}
    a = ref.decode_step(dims, weights, clone_inputs(inp), routing=routing)
    forced = torch.zeros(dims.num_layers, 3, dims.top_k, dtype=torch.int32)
    for layer, (_, own) in routing.items():
        forced[layer] = own
    b = ref.decode_step(dims, weights, clone_inputs(inp), forced_experts=forced)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert len(routing) == sum(not d for d in dims.dense)


@pytest.mark.parametrize("layer", [1, 4])  # the tiny config's layer 1 slides, layer 4 sees everything
def test_attention_alone_schedule_matches_the_reference_attention(dims, weights, layer):
    """schedule.attention_schedule (benchmarks.attention_bench times it): one layer's partial and combine
    waves over q and a cache already in place -- deadlock- and race-free, and its output is the reference's
    attention for every live row (a sliding and a full layer, ragged lengths, one padding row)."""
    from vllm_megakernel.megakernel.schedule import attention_schedule

    batch, lengths = 4, [1, dims.sliding_window + 3, 2 * dims.sliding_window + 1]
    gen = torch.Generator().manual_seed(layer)
    sim = PagedKVSim(dims, num_requests=batch, max_len=max(lengths) + 1, block_size=4, seed=layer)
    sim.fill_history(lengths + [0], generator=gen)
    inp = sim.step([5, 6, 7, None])
    hq, hkv, d = dims.num_heads, dims.num_kv_heads, dims.head_dim
    group = inp.groups[inp.layer_group[layer]]
    ref.write_kv(inp.kv_caches[layer], group.slot_mapping, torch.randn(batch, hkv, d, generator=gen),
                 torch.randn(batch, hkv, d, generator=gen))  # the new token's K/V, which qkv would write
    sched = attention_schedule(dims, StepShape(batch=batch, num_sms=5, attn_splits=3, attn_min_tiles=1), layer,
                               *weights.intermediates())
    assert {t.wave for t in sched.tasks} == {"attn_partial", "attn_combine"}
    assert all(t.layer == layer for t in sched.tasks)
    simulate.check_races(sched)
    numerics = simulate.Numerics(sched, weights, inp)
    numerics.q[:] = torch.randn(numerics.q.shape, generator=gen)
    simulate.run(sched, numerics, order="random", seed=layer)
    window = dims.sliding_window if dims.sliding[layer] else None
    for r in range(batch):
        if inp.seq_lens[r] == 0:
            continue
        want = ref.attend(numerics.q[r], inp.kv_caches[layer], group.block_table[r], int(inp.seq_lens[r]), window,
                          hkv)
        torch.testing.assert_close(numerics.attn[r].view(hq, d), want, atol=1e-5, rtol=1e-5)


def step_at_batch_19(dims, weights, **shape):
    """The reference's and the simulated schedule's step at batch 19 (the norm wave and the grouped GEMMs;
    ragged histories, the last row padding), the schedule built with ``shape``'s choices."""
    batch = 19
    gen = torch.Generator().manual_seed(7)
    lengths = [1, 5, 9, 2] * 4 + [3, 7]
    sim = PagedKVSim(dims, num_requests=batch, max_len=max(lengths) + 1, block_size=4, seed=3)
    for step in range(max(lengths)):
        toks = [int(torch.randint(0, dims.vocab, (1,), generator=gen)) if step < n else None for n in lengths]
        ref.decode_step(dims, weights, sim.step(toks + [None]))
    inp = sim.step([int(torch.randint(0, dims.vocab, (1,), generator=gen)) for _ in lengths] + [None])
    ref_inp, mk_inp = clone_inputs(inp), clone_inputs(inp)
    expected = ref.decode_step(dims, weights, ref_inp)
    sched = build_schedule(dims, StepShape(batch=batch, num_sms=7, attn_splits=2, attn_min_tiles=1, **shape),
                           *weights.intermediates())
    got = simulate.decode_step(sched, weights, mk_inp, order="random", seed=5)
    return sched, got, expected


def test_moe_combine_in_narrower_column_tasks_runs_the_same_step_race_free(dims, weights):
    """moe_combine_cols (a kernel_profile schedule choice): the MoE combine split into tasks of fewer
    hidden columns signals the same barrier from more tasks; the step matches the reference and no access
    is left unordered. A width that is not a multiple of the region unit, or does not divide the hidden
    size, is refused."""
    sched, got, expected = step_at_batch_19(dims, weights, moe_combine_cols=16)
    combines = [t for t in sched.tasks if t.op == Op.MOE_COMBINE and t.layer == 1]
    assert len(combines) == dims.hidden // 16
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    simulate.check_races(sched)
    shape = sched.shape
    with pytest.raises(ValueError, match="multiple of 16"):
        StepShape(batch=19, num_sms=7, moe_combine_cols=24)
    with pytest.raises(ValueError, match="MOE_COMBINE width"):
        build_schedule(dims, dataclasses.replace(shape, moe_combine_cols=48), *weights.intermediates())


def test_moe_combine_folded_into_the_next_norm_runs_the_same_step_race_free(dims, weights):
    """combine_in_norm: no MOE_COMBINE task is left; the norm after a MoE layer (and the final norm) waits
    on that layer's down wave and O projection, reads the expert outputs and their weights instead of mlp,
    one batch row a task on all consumer warps; the step matches the reference and is race-free. Refused
    where the norm is folded into its readers (no norm wave to fold the combine into)."""
    sched, got, expected = step_at_batch_19(dims, weights, combine_in_norm=True)
    assert not [t for t in sched.tasks if t.op == Op.MOE_COMBINE]
    names = {i: bar.name for i, bar in enumerate(sched.barriers)}
    for layer in range(1, dims.num_layers + 1):
        norms = [t for t in sched.tasks if t.op == Op.NORM and t.layer == layer]
        assert len(norms) == 19 and all(t.fields["rows"] == 1 and t.fields["row_warps"] == 8 for t in norms)
        moe = not dims.dense[layer - 1]
        assert all(t.fields["moe"] == int(moe) for t in norms)
        waits = {names[w] for w in norms[0].waits}
        assert waits == {f"L{layer - 1}.o_proj", f"L{layer - 1}." + ("moe_down" if moe else "mlp")}
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    simulate.check_races(sched)
    with pytest.raises(ValueError, match="combine_in_norm needs a norm wave"):
        build_schedule(dims, StepShape(batch=8, num_sms=7, combine_in_norm=True), *weights.intermediates())
    # a NORM form the kernel does not have (it would run it wrong, not refuse it) fails in the simulator
    sim = PagedKVSim(dims, num_requests=19, max_len=4, block_size=4, seed=1)
    numerics = simulate.Numerics(sched, weights, sim.step([1] * 19))
    for rows, row_warps, moe in ((2, 8, 1), (1, 4, 1), (8, 1, 1)):
        with pytest.raises(ValueError, match="has no kernel form"):
            numerics.norm(1, 0, rows, 0, moe, row_warps)


@pytest.mark.parametrize("split, shape", [(2, {}), (3, {"combine_in_norm": True}), (9, {}), (19, {})])
def test_qkv_tasks_split_by_batch_rows_run_the_same_step_race_free(dims, weights, split, shape):
    """qkv_batch_split: a QKV task per tile and batch-row slice (the last slice shorter where the batch does
    not divide), each writing its rows' q and new K/V only; the step matches the reference and no two slices'
    writes are unordered with the attention that reads them. Refused where the norm is folded."""
    sched, got, expected = step_at_batch_19(dims, weights, qkv_batch_split=split, **shape)
    qkv = [t for t in sched.tasks if t.op == Op.QKV_ROPE and t.layer == 1]
    slices = sorted({(t.fields["batch0"], t.fields["batch_rows"]) for t in qkv})
    assert len(slices) == split  # as many slices as asked, covering the batch once, as even as it allows
    assert [b0 for b0, _ in slices] == [0] + [b0 + n for b0, n in slices[:-1]] and sum(n for _, n in slices) == 19
    assert max(n for _, n in slices) - min(n for _, n in slices) <= 1
    assert len(qkv) == len(slices) * len({t.fields["row0"] for t in qkv})
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    simulate.check_races(sched)
    with pytest.raises(ValueError, match="qkv_batch_split needs a norm wave"):
        build_schedule(dims, StepShape(batch=8, num_sms=7, qkv_batch_split=2), *weights.intermediates())
    with pytest.raises(ValueError, match="qkv_batch_split=20"):
        StepShape(batch=19, num_sms=7, qkv_batch_split=20)


@pytest.mark.parametrize("split, shape", [(2, {}), (3, {"qkv_batch_split": 2}), (19, {})])
def test_o_tasks_split_by_batch_rows_run_the_same_step_race_free(dims, weights, split, shape):
    """o_batch_split: an O projection task per tile and batch-row slice, each writing its rows of the tile's
    columns of o only; the step matches the reference, and the next norm (which reads every row of o) is
    ordered after every slice. Unlike the QKV split, also where the norm is folded (batch 8)."""
    sched, got, expected = step_at_batch_19(dims, weights, o_batch_split=split, **shape)
    o = [t for t in sched.tasks if t.op == Op.O_PROJ and t.layer == 1]
    slices = sorted({(t.fields["batch0"], t.fields["batch_rows"]) for t in o})
    assert len(slices) == split and sum(n for _, n in slices) == 19
    assert [b0 for b0, _ in slices] == [0] + [b0 + n for b0, n in slices[:-1]]
    assert len(o) == split * len({t.fields["row0"] for t in o})
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    simulate.check_races(sched)
    small = build_schedule(dims, StepShape(batch=8, num_sms=7, o_batch_split=2), *weights.intermediates())
    assert {(t.fields["batch0"], t.fields["batch_rows"]) for t in small.tasks if t.op == Op.O_PROJ} == {(0, 4), (4, 4)}
    with pytest.raises(ValueError, match="o_batch_split=20"):
        StepShape(batch=19, num_sms=7, o_batch_split=20)
    # the default: one task a tile, every row
    unsplit = build_schedule(dims, StepShape(batch=19, num_sms=7), *weights.intermediates())
    assert all(t.fields["batch_rows"] == 0 for t in unsplit.tasks if t.op == Op.O_PROJ)


def test_from_batch_32_the_combine_folds_into_the_norm_and_qkv_tiles_split_by_default(dims, weights, monkeypatch):
    """layout.HEAD_SPLIT_FROM_BATCH: StepShape left to its defaults folds the MoE combine into the next norm and
    splits each QKV tile in two batch-row slices from batch 32, and neither below it; from WIDE_HEAD_FROM_BATCH
    (33) the QKV tiles have 80 weight rows (128 QKV tasks at batch 64) and each O tile 32 rows in four batch-row
    slices (256 O tasks at batch 64). With the thresholds moved to 19, the default step at batch 19 takes all of
    it and still matches the reference, race-free."""
    config = json.loads((FULL_CONFIG / "config.json").read_text())
    full = ref.ModelDims.from_config(config)
    full_sizes = (config["intermediate_size"], config["prefix_dense_intermediate_size"])
    for batch, fold, o_split in ((16, False, 1), (31, False, 1), (32, True, 1), (33, True, 4), (64, True, 4)):
        shape = StepShape(batch=batch, num_sms=132)
        assert (shape.combine_in_norm, shape.qkv_batch_split, shape.o_batch_split) == (fold, 2 if fold else 1, o_split)
    assert [layout.gemm_tiles(full, *full_sizes, b).qkv_rows for b in (32, 33, 64)] == [64, 80, 80]
    assert [layout.gemm_tiles(full, *full_sizes, b).o_rows for b in (32, 33, 64)] == [16, 32, 32]
    at_64 = build_schedule(full, StepShape(batch=64, num_sms=132), *full_sizes)
    assert [len([t for t in at_64.tasks if t.op == op and t.layer == 1]) for op in (Op.QKV_ROPE, Op.O_PROJ)] == [128, 256]
    # choices asked for still win over the default
    shape = StepShape(batch=64, num_sms=132, combine_in_norm=False, qkv_batch_split=1, o_batch_split=1)
    assert (shape.combine_in_norm, shape.qkv_batch_split, shape.o_batch_split) == (False, 1, 1)
    monkeypatch.setattr(layout, "HEAD_SPLIT_FROM_BATCH", 19)
    monkeypatch.setattr(layout, "WIDE_HEAD_FROM_BATCH", 19)
    sched, got, expected = step_at_batch_19(dims, weights)
    assert not [t for t in sched.tasks if t.op == Op.MOE_COMBINE]
    qkv = [t for t in sched.tasks if t.op == Op.QKV_ROPE and t.layer == 1]
    assert sorted({(t.fields["batch0"], t.fields["batch_rows"]) for t in qkv}) == [(0, 9), (9, 10)]
    o = [t for t in sched.tasks if t.op == Op.O_PROJ and t.layer == 1]
    assert sorted({(t.fields["batch0"], t.fields["batch_rows"]) for t in o}) == [(0, 4), (4, 5), (9, 5), (14, 5)]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    simulate.check_races(sched)


def test_combine_tasks_take_at_most_eight_heads():
    """One head a combine task at batch 1-2, four to batch 8, then eight at every batch up to 64 (batch 64's
    tasks of all 32 heads measured ~3% slower a step), and never more heads than the model has."""
    assert [layout.combine_heads_for(b, 32) for b in (1, 2, 3, 8, 9, 32, 33, 64)] == [1, 1, 4, 4, 8, 8, 8, 8]
    assert layout.combine_heads_for(64, 4) == 4


def test_attention_splits_give_every_sm_work_and_follow_the_live_length():
    """About one (request, split) task per SM; a split covers whole 16-token tiles, at least min_tiles of
    them, so short contexts use fewer splits (the rest return at once) and the splits cover exactly the
    visible positions."""
    assert layout.attn_splits_for(1, 132) == 128 and layout.attn_splits_for(8, 132) == 16
    assert layout.attn_splits_for(16, 132) == 8 and layout.attn_splits_for(64, 132) == 2
    assert layout.attn_splits_for(200, 132) == 1
    for batch in range(1, 133):  # never more (request, split) tasks than SMs, and the split not one short
        splits = layout.attn_splits_for(batch, 132)
        assert batch * splits <= 132 and (splits == layout.MAX_ATTN_SPLITS or batch * (splits + 1) > 132)
    assert layout.attn_split_tiles(0, None, 8, 2) == (0, 0, 0)  # padding row
    assert layout.attn_split_tiles(1, None, 8, 2) == (0, 2, 1)
    assert layout.attn_split_tiles(8192 + 1, None, 128, 2) == (0, 5, 103)
    assert layout.attn_split_tiles(1000, None, 128, 2) == (0, 2, 32)
    # a cap of 64 live splits: 8K's full and sliding layers on 57 / 52 splits (s64's runs), while 32K's full
    # layer keeps its 121 splits of 17 tiles (the cap would need 33-tile runs, past max_tiles=16)
    assert layout.attn_split_tiles(8192 + 1, None, 128, 2, 64, 16) == (0, 9, 57)
    assert layout.attn_split_tiles(8192 + 1, 4096, 128, 2, 64, 16) == (256, 5, 52)
    assert layout.attn_split_tiles(32768 + 1, None, 128, 2, 64, 16) == (0, 17, 121)
    assert layout.attn_split_tiles(16384 + 1, None, 128, 2, 64, 16) == (0, 16, 65)
    assert layout.attn_split_tiles(8192 + 1, None, 128, 2, 0, 16) == (0, 5, 103)  # 0: off
    assert layout.attn_live_splits_for(1, 64) == 64 and layout.attn_live_splits_for(3, 64) == 21
    assert layout.attn_live_splits_for(128, 64) == 1 and layout.attn_live_splits_for(2, 0) == 0
    for (seq_len, window, splits), (live, most) in itertools.product(
            [(1, None, 4), (17, None, 4), (4097, 4096, 128), (9000, 4096, 3), (33, 32, 2), (131073, None, 128)],
            [(0, 16), (64, 16), (3, 4), (1, 1)]):
        first, per, used = layout.attn_split_tiles(seq_len, window, splits, 2, live, most)
        assert used <= splits and per >= 2
        if live:
            plain = layout.attn_split_tiles(seq_len, window, splits, 2)
            assert used <= plain[2] and (used <= live or per >= most or per == plain[1])
        start, end = layout.visible_range(seq_len, window)
        covered = []
        for s in range(used):
            lo = max(start, (first + s * per) * layout.ATTN_TILE)
            hi = min(end, (first + (s + 1) * per) * layout.ATTN_TILE)
            assert lo < hi  # every split in use holds visible keys
            covered += range(lo, hi)
        assert covered == list(range(start, end))


def wave_boundaries(sched):
    """Every (layer, wave) of the schedule with its task range, in order."""
    seen = []
    for t in sched.tasks:
        if not seen or seen[-1][:2] != (t.layer, t.wave):
            seen.append((t.layer, t.wave))
    return [(layer, wave, *sched.wave_range(layer, wave)) for layer, wave in seen]


@pytest.mark.parametrize("batch", [1, 3])
def test_every_wave_prefix_is_a_complete_schedule(dims, batch):
    """The step cut after any wave (what the per-opcode GPU tests run) has exact barrier counts, cannot
    deadlock and has no unordered conflicting accesses."""
    sched = tiny_schedule(dims, batch)
    waves = wave_boundaries(sched)
    assert waves[0][2] == 0 and waves[-1][3] == len(sched.tasks)
    assert all(a[3] == b[2] for a, b in zip(waves, waves[1:]))  # contiguous, in order
    for _, _, _, stop in waves:
        cut = sched.truncated(stop)
        assert len(cut.tasks) == stop and sum(map(len, cut.sm_tasks)) == stop
        simulate.run(cut, order="random", seed=stop)
        simulate.check_races(cut)
        cut.encode()


def test_any_task_prefix_runs_to_completion(dims):
    """Cutting between two tasks of one wave still leaves every kept wait on a fully kept barrier."""
    sched = tiny_schedule(dims, 3)
    for n in range(1, len(sched.tasks), 7):
        simulate.run(sched.truncated(n))


def test_the_route_buffer_keeps_each_moe_layers_distinct_experts_for_a_graph_replayed_step(dims, weights):
    """runtime.routed_experts reads the per-layer slot counts a step's top-k left in the route buffer (written
    here by the CPU simulator in the kernel's layout): each equals the distinct experts the reference routed for
    the live rows; mean_routed_experts refuses the words of a step of another size."""
    from vllm_megakernel.megakernel import runtime

    batch = 3
    sim = PagedKVSim(dims, num_requests=batch, max_len=40, block_size=4, seed=3)
    sim.fill_history([30, 9, 0], generator=torch.Generator().manual_seed(3))
    inp = sim.step([7, 8, None])  # the third row is padding: not routed
    sched = tiny_schedule(dims, batch)
    numerics = simulate.Numerics(sched, weights, inp)
    simulate.run(sched, numerics)
    ws = runtime.allocate_workspace(dims, [(batch, 2), (8, 2)], *weights.intermediates(), device="cpu",
                                    dtype=torch.float32)
    numerics.store_workspace(ws)
    routing: dict = {}
    ref.decode_step(dims, weights, inp, routing=routing)
    want = {layer: len(set(choice[:2].flatten().tolist())) for layer, (_, choice) in routing.items()}
    got = runtime.routed_experts(ws, dims, batch)
    assert got == want and min(want.values()) > dims.top_k  # two live rows, and they share no full set
    assert runtime.mean_routed_experts(ws, dims, batch) == pytest.approx(sum(want.values()) / len(want))
    assert runtime.mean_routed_experts(ws, dims, 8) is None  # batch 8's words are not where batch 3 wrote


@pytest.mark.parametrize("posted_routing", [True, False], ids=["posted-routing", "barrier-routing"])
def test_workspace_round_trip_resumes_the_step_exactly(dims, weights, posted_routing):
    """Run the step to the middle of a MoE layer with torch ops, store the state in the kernel's workspace
    layout, load it into a fresh interpreter, finish the step there: same output as one uninterrupted run.
    This pins load_workspace (used on the GPU to feed the kernel's own state to the torch version of the
    next wave), including the route buffer's layout and, with posted routing (batch 1-4's default), the layer's
    posted words, which the workspace does not hold and load_workspace rebuilds from the route buffer."""
    from vllm_megakernel.megakernel import runtime

    batch = 3
    sim = PagedKVSim(dims, num_requests=batch, max_len=40, block_size=4, seed=5)
    sim.fill_history([30, 9, 0], generator=torch.Generator().manual_seed(5))
    inp = sim.step([7, 8, None])
    sched = build_schedule(dims, StepShape(batch=batch, num_sms=5, attn_splits=2, attn_min_tiles=1,
                                           posted_routing=posted_routing), *weights.intermediates())
    assert sched.shape.posted_routing == posted_routing
    whole = simulate.decode_step(sched, weights, clone_inputs(inp))

    moe_layer = next(i for i, d in enumerate(dims.dense) if not d)
    cut = sched.wave_range(moe_layer, "mlp_down")[0]  # routed, up/gate done, down not yet
    first = clone_inputs(inp)
    a = simulate.Numerics(sched, weights, first)
    simulate.run(sched.truncated(cut), a)
    ws = runtime.allocate_workspace(dims, [(batch, 2)], *weights.intermediates(), device="cpu", dtype=torch.float32)
    a.store_workspace(ws)
    assert int(ws["route"][0]) == len(a.slot_expert) > 0
    b = simulate.Numerics(sched, weights, first)
    b.load_workspace(ws)
    assert b.slot_expert == a.slot_expert and b.slot_rows == a.slot_rows
    assert a.layer_active and all(b.layer_active[layer] == n for layer, n in a.layer_active.items())
    assert b.posts.get(moe_layer) == a.posts.get(moe_layer) and (moe_layer in b.posts) == posted_routing
    for t in sched.tasks[cut:]:
        b(t)
    torch.testing.assert_close(b.out, whole, atol=0, rtol=0)


def test_later_tasks_do_not_lean_on_the_waits_an_empty_attention_split_skips(dims, monkeypatch):
    # The kernel skips the input waits of an attention split with nothing to do (abi.WAITS_ONLY_IF_WORK).
    # A task after it on its SM that reads q, ordered after the layer's qkv only through the split's wait,
    # is a race; it would not be if the split always waited.
    s = tiny_schedule(dims, 1, expert_claims=False)  # expert tasks where they were dealt
    for lst in s.sm_tasks:
        pairs = [(a, b) for a, b in zip(lst, lst[1:])
                 if s.tasks[a].op == Op.ATTN_PARTIAL and s.tasks[b].op == Op.MOE_UPGATE
                 and s.tasks[a].layer == s.tasks[b].layer]
        if pairs:
            split, later = (s.tasks[i] for i in pairs[0])
            break
    else:
        pytest.fail("no SM runs an expert task right after an attention split")
    assert split.waits_only_if_work and not later.waits_only_if_work
    later.reads += (("q",),)
    with pytest.raises(simulate.RaceError, match="'q'"):
        simulate.check_races(s)
    monkeypatch.setattr("vllm_megakernel.megakernel.schedule.WAITS_ONLY_IF_WORK", frozenset())
    simulate.check_races(s)


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("order,seed", [("round_robin", 0), ("reverse", 0), ("random", 1), ("random", 2)])
def test_claimed_expert_tasks_each_run_once_in_their_waves_places_and_race_free(dims, batch, order, seed):
    s = tiny_schedule(dims, batch)
    claiming = [t for t in s.tasks if t.claim != NO_BARRIER]
    assert {t.op for t in claiming} == {Op.MOE_UPGATE, Op.MOE_DOWN}
    placed = []
    done = simulate.run(s, order=order, seed=seed, placed=placed)
    assert sorted(done) == list(range(len(s.tasks)))
    for sm, (static, ran) in enumerate(zip(s.sm_tasks, placed)):
        for i, j in zip(static, ran):  # a place runs its own task, or one of the same claimed wave
            assert i == j or s.tasks[i].claim == s.tasks[j].claim != NO_BARRIER
    assert placed != s.sm_tasks or order == "round_robin"  # other orders move claimed tasks between SMs
    simulate.check_races(s, order=order, seed=seed)



def test_uniform_experts_are_uniform_distinct_and_new_every_step():
    """reference.uniform_experts stands in for vLLM's torch.randint routing: every expert about equally
    often, K distinct experts per row (so an expert's rows never outnumber the batch), a different draw per
    position and per layer."""
    E, K = 128, 8
    pos = torch.arange(4096)
    draws = ref.uniform_experts(3, pos, K, E)
    counts = torch.bincount(draws.flatten(), minlength=E).float()
    expected = draws.numel() / E  # 256
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 200  # 127 degrees of freedom: mean 127, sd ~16
    assert all(len(set(row.tolist())) == K for row in draws)
    # the first K distinct draws: the rows whose first K draws repeated took later ones
    firsts = torch.tensor([[ref.uniform_draw(3, p, p, j, E) for j in range(K)] for p in range(4096)])
    assert (firsts != draws).any(dim=1).sum() > 100  # ~20% of rows repeat within 8 draws of 128
    assert bool(((firsts == draws) | (firsts != draws).cumsum(1).bool()).all())  # a row agrees up to its first repeat
    assert (ref.uniform_experts(3, pos + 1, K, E) != draws).float().mean() > 0.9
    assert (ref.uniform_experts(4, pos, K, E) != draws).float().mean() > 0.9


def test_uniform_experts_of_rows_at_one_position_are_independent():
    """A sweep's batch has equal prompts, so every row is at the same position: its rows must still draw
    apart, as vLLM's torch.randint does per token (keyed on the position alone, 8 rows drew the same 8
    experts, and the megakernel side read a batch-1 share of expert bytes at batch 8)."""
    E, K, B = 128, 8, 8
    distinct = [len(set(ref.uniform_experts(layer, torch.full((B,), 8192), K, E).flatten().tolist()))
                for layer in range(48)]
    expected = E * (1 - (1 - K / E) ** B)  # 51.6 distinct experts of 128 for 8 rows of 8 distinct
    assert abs(sum(distinct) / len(distinct) - expected) < 2.0


@pytest.mark.parametrize("batch", [1, 5])
def test_step_with_uniform_routing_matches_the_reference(dims, weights, batch):
    """The step table's uniform_routing: the top-k draws reference.uniform_experts with weight 1 instead of
    routing; the simulated step matches the reference step that does the same, and not the routed one."""
    gen = torch.Generator().manual_seed(batch)
    lengths = [3, 9, 17, 2][: max(batch - 1, 1)]
    sim = PagedKVSim(dims, num_requests=batch, max_len=max(lengths) + 1, block_size=4, seed=batch)
    sim.fill_history(lengths + [0] * (batch - len(lengths)), generator=gen)
    toks = [int(torch.randint(0, dims.vocab, (1,), generator=gen)) for _ in lengths]
    inp = sim.step(toks + [None] * (batch - len(lengths)))
    sched = build_schedule(dims, StepShape(batch=batch, num_sms=5, attn_splits=2, attn_min_tiles=1),
                           *weights.intermediates())
    got = simulate.decode_step(sched, weights, clone_inputs(inp), order="random", seed=batch,
                               uniform_routing=True)
    expected = ref.decode_step(dims, weights, clone_inputs(inp), uniform_routing=True)
    routed = ref.decode_step(dims, weights, clone_inputs(inp))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    live = inp.seq_lens > 0
    assert not torch.allclose(got[live], routed[live], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("batch, order", [(1, "random"), (3, "reverse")])
def test_dealing_by_layer_puts_every_layers_routing_on_the_same_sms(dims, weights, batch, order):
    """StepShape.deal="by_layer" (the default) restarts the round-robin at SM 0 on every layer: each layer's
    router tasks and top-k sit on the same SMs, every SM's list stays in step order, and the step is the
    same as dealt continuously, deadlock- and race-free either way."""
    gen = torch.Generator().manual_seed(batch)
    lengths = [5, 9, 2][:batch]
    sim = PagedKVSim(dims, num_requests=batch, max_len=max(lengths) + 1, block_size=4, seed=batch)
    sim.fill_history(lengths, generator=gen)
    inp = sim.step([int(torch.randint(0, dims.vocab, (1,), generator=gen)) for _ in lengths])
    shape = dict(batch=batch, num_sms=5, attn_splits=2, attn_min_tiles=1)
    plain = build_schedule(dims, StepShape(**shape, deal="continuous"), *weights.intermediates())
    by_layer = build_schedule(dims, StepShape(**shape), *weights.intermediates())
    def routing_places(s):  # per MoE layer: (wave, SM) of its router tasks and top-k, in task order
        places = defaultdict(list)
        for t in s.tasks:
            if t.wave in ("router", "router_topk"):
                places[t.layer].append((t.wave, t.sm))
        return {tuple(p) for p in places.values()}

    assert len(routing_places(by_layer)) == 1 < len(routing_places(plain))
    assert all(lst == sorted(lst) for lst in by_layer.sm_tasks)
    simulate.check_races(plain, order=order, seed=batch)
    assert_race_free_and_bit_equal(by_layer, plain, weights, inp, order, batch)
    with pytest.raises(ValueError, match="deal="):
        StepShape(**shape, deal="random")


@pytest.mark.parametrize("order", ["round_robin", "reverse", "random"])
@pytest.mark.parametrize("claims", [True, False])
def test_dead_slots_tasks_are_skipped_and_the_top_k_makes_up_the_down_barrier(dims, order, claims):
    """With fewer routed experts than slots, the producers skip the dead slots' expert tasks (nothing is
    published, nothing signals) and each top-k adds the dead slots' down tiles to its down barrier: the
    step completes under every interleaving, runs exactly the live tasks, and the MoE combine still waits
    on every down tile. Without the top-k's share it deadlocks at the combine. A producer that claimed a
    dead tile claims no more on that wave: each wave's counter takes its live tiles plus at most one dead
    one per SM, and fewer claims than places where an SM holds several dead places."""
    s = tiny_schedule(dims, 3, num_sms=3, expert_claims=claims)
    slots = moe_slots(dims, 3)
    live = {layer: 1 + layer % (slots - 1) for layer in range(dims.num_layers)}  # 1 .. slots-1 live
    taken: dict[int, int] = {}
    done = simulate.run(s, order=order, seed=11, live_slots=live.__getitem__, claims_taken=taken)
    dead = {t.index for t in s.tasks if t.op in (Op.MOE_UPGATE, Op.MOE_DOWN) and t.fields["slot"] >= live[t.layer]}
    assert dead and sorted(done) == sorted(set(range(len(s.tasks))) - dead)
    assert bool(taken) == claims
    for counter, n in taken.items():
        wave = [t for t in s.tasks if t.claim == counter]
        alive = sum(t.fields["slot"] < live[t.layer] for t in wave)
        assert alive <= n <= min(len(wave), alive + len(s.sm_tasks))
    assert any(n < sum(t.claim == c for t in s.tasks) for c, n in taken.items()) == claims
    down = {t.fields["down_barrier"] for t in s.tasks if t.op == Op.ROUTER_TOPK}
    assert down == {b for b, bar in enumerate(s.barriers) if bar.name.endswith(".moe_down")}
    for t in s.tasks:
        if t.op == Op.ROUTER_TOPK:
            t.fields["down_barrier"] = NO_BARRIER
    with pytest.raises(simulate.Deadlock, match=r"moe_down"):
        simulate.run(s, order=order, seed=11, live_slots=live.__getitem__)


def test_every_expert_task_of_a_layer_waits_on_the_layers_routing(dims):
    """The producer waits for a layer's routing at its first expert place only (csrc/ops/moe.cuh's
    RoutingSeen): the schedule builder refuses a layer whose expert tasks load-wait on different barriers."""
    from vllm_megakernel.megakernel.schedule import _check_routed_load_waits

    for posted in (False, True):  # the top-k's barrier, or with posted routing (batch 1-4's default) the router wave's
        s = tiny_schedule(dims, 3, num_sms=3, posted_routing=posted)
        _check_routed_load_waits(s.tasks, posted=posted)
        expert = [t for t in s.tasks if t.op in (Op.MOE_UPGATE, Op.MOE_DOWN)]
        assert len({t.load_wait for t in expert if t.layer == expert[0].layer}) == 1
        other = next(t for t in reversed(expert) if t.layer == expert[0].layer)
        other.load_wait = expert[0].load_wait + 1
        with pytest.raises(AssertionError, match="another barrier"):
            _check_routed_load_waits(s.tasks, posted=posted)


@pytest.mark.parametrize("batch, order, fraction", [(1, "random", 0.4), (3, "reverse", 0.5), (5, "random", 0.3),
                                                     (16, "reverse", None)])  # None: the batch's default
def test_o_projection_dealt_among_the_down_places_runs_the_same_step(dims, weights, batch, order, fraction):
    """o_within_down deals each layer's O projection places after that fraction of its down places: every
    SM's list then holds, per layer, its down places (before) and its O places (after) in the dealt
    proportions, the step is deadlock- and race-free under any SM order, and it computes exactly what the
    wave order's dealing (o_within_down=0) computes."""
    gen = torch.Generator().manual_seed(batch)
    lengths = [5, 9, 2, 7, 1, 3, 8, 4, 6, 2, 5, 1, 9, 7, 3, 4][:batch]
    sim = PagedKVSim(dims, num_requests=batch, max_len=max(lengths) + 1, block_size=4, seed=batch)
    sim.fill_history(lengths, generator=gen)
    inp = sim.step([int(torch.randint(0, dims.vocab, (1,), generator=gen)) for _ in lengths])
    shape = dict(batch=batch, num_sms=5, attn_splits=2, attn_min_tiles=1)
    plain = build_schedule(dims, StepShape(**shape, o_within_down=0), *weights.intermediates())
    within = build_schedule(dims, StepShape(**shape, o_within_down=fraction), *weights.intermediates())
    fraction = within.shape.o_within_down
    assert fraction > 0
    assert [t.fields for t in within.tasks] == [t.fields for t in plain.tasks]  # same tasks, dealt otherwise
    for layer in range(dims.num_layers):
        down0, down1 = within.wave_range(layer, "mlp_down")
        o0, o1 = within.wave_range(layer, "o_proj")
        before = after = 0  # down places ahead of / behind the SM's first O place, over the SMs
        for lst in within.sm_tasks:
            mine = [i for i in lst if down0 <= i < down1 or o0 <= i < o1]
            first_o = next((k for k, i in enumerate(mine) if o0 <= i < o1), len(mine))
            before += sum(down0 <= i < down1 for i in mine[:first_o])
            after += sum(down0 <= i < down1 for i in mine[first_o:])
        # round-robin: about the fraction of the down places lies ahead of the O places, the rest behind
        ahead = round((down1 - down0) * fraction)
        assert abs(before - ahead) <= within.shape.num_sms
        # the places dealt after the O places land behind one on some SM, unless they are so few that
        # they all fall on SMs that hold no O place (the tiny dense layer: 4 down and 4 O places, 5 SMs)
        assert after > 0 or (down1 - down0) - ahead < within.shape.num_sms
        assert all(lst.index(i) > lst.index(c) for lst in within.sm_tasks for i in lst if o0 <= i < o1
                   for c in lst if within.tasks[c].layer == layer and within.tasks[c].wave == "attn_combine")
    assert_race_free_and_bit_equal(within, plain, weights, inp, order, batch)


def test_from_batch_16_the_default_runs_a_norm_wave_and_deals_the_o_projection_among_the_down_places():
    """layout.WIDE_FROM_BATCH's defaults, measured to pay at batch 16 only: the norm as a wave, at most one
    attention task per SM, the O projection after 70% of the down places; an explicit 0 or an order that
    cannot move the O projection keeps it after the down places."""
    assert layout.fold_norm(15) and not layout.fold_norm(16)
    shape = StepShape(batch=16, num_sms=132)
    assert shape.attn_splits * shape.batch <= shape.num_sms
    assert StepShape(batch=8, num_sms=132).o_within_down == 0.0
    assert StepShape(batch=16, num_sms=132).o_within_down == layout.O_WITHIN_DOWN > 0
    assert StepShape(batch=64, num_sms=132).o_within_down == layout.O_WITHIN_DOWN
    assert StepShape(batch=16, num_sms=132, o_within_down=0).o_within_down == 0.0
    assert StepShape(batch=16, num_sms=132, order="experts_then_combine").o_within_down == 0.0


def test_o_within_down_needs_an_order_that_allows_it():
    for bad in ({"o_within_down": 1.0}, {"o_within_down": -0.1},
                {"o_within_down": 0.5, "order": "experts_then_combine"},
                {"o_within_down": 0.5, "order": "o_proj_before_down"}):
        with pytest.raises(ValueError, match="o_within_down"):
            StepShape(batch=3, num_sms=5, **bad)
    StepShape(batch=3, num_sms=5, o_within_down=0.5, order="combine_before_experts")


def test_stages_in_flight_takes_the_layouts_choice_and_stays_within_the_ring():
    """StepShape.stages_in_flight: 0 takes layout.stages_in_flight_for the batch (a shallow cap where the step
    is latency-bound, the whole ring from batch 8); an explicit cap is kept; outside 1 .. the ring's buffers it
    is refused, since a cap of 0 would let no stage issue. The cap changes no task: the same lists either way."""
    assert StepShape(batch=1, num_sms=132).stages_in_flight == layout.stages_in_flight_for(1) < layout.STAGES
    assert StepShape(batch=8, num_sms=132).stages_in_flight == layout.STAGES
    assert StepShape(batch=64, num_sms=132).stages_in_flight == layout.STAGES
    assert StepShape(batch=8, num_sms=132, stages_in_flight=1).stages_in_flight == 1
    for bad in (-1, layout.STAGES + 1):
        with pytest.raises(ValueError, match="stages_in_flight"):
            StepShape(batch=3, num_sms=5, stages_in_flight=bad)


def test_a_cap_on_stages_in_flight_deals_the_same_tasks(dims, weights):
    capped = build_schedule(dims, StepShape(batch=3, num_sms=5, stages_in_flight=1), *weights.intermediates())
    whole = build_schedule(dims, StepShape(batch=3, num_sms=5, stages_in_flight=layout.STAGES),
                           *weights.intermediates())
    assert [t.fields for t in capped.tasks] == [t.fields for t in whole.tasks]
    assert capped.sm_tasks == whole.sm_tasks


def test_a_prefix_keeps_the_top_ks_share_only_where_it_keeps_the_whole_down_wave(dims):
    """truncated(): a top-k whose layer's down wave is cut signals nothing extra (the kept dead tiles stay
    unsignalled, and nothing kept waits on them); the prefix still completes with dead slots."""
    s = tiny_schedule(dims, 3, num_sms=3)
    layer = next(i for i, d in enumerate(dims.dense) if not d)
    cut = s.wave_range(layer, "mlp_down")[0] + 1
    prefix = s.truncated(cut)
    share = {t.layer: t.fields["down_barrier"] for t in prefix.tasks if t.op == Op.ROUTER_TOPK}
    assert share[layer] == NO_BARRIER
    assert all(b != NO_BARRIER for lay, b in share.items() if lay < layer)
    simulate.run(prefix, order="random", seed=2, live_slots=lambda lay: 1)


def test_the_numerics_run_exactly_the_live_slots_expert_tiles(dims, weights):
    """decode_step skips the dead slots' tasks as the kernel does, its routing being the numerics' own
    top-k: each MoE layer runs its live slots' up/gate and down tiles and no others (a padding row leaves
    slots dead). That the step still equals the reference is test_step_through_schedule_matches_reference."""
    sim = PagedKVSim(dims, num_requests=3, max_len=40, block_size=4, seed=5)
    sim.fill_history([30, 9, 0], generator=torch.Generator().manual_seed(5))
    inp = sim.step([7, 8, None])
    s = build_schedule(dims, StepShape(batch=3, num_sms=5, attn_splits=2, attn_min_tiles=1), TINY_I, TINY_DENSE_I)
    numerics = simulate.Numerics(s, weights, clone_inputs(inp))
    live, ran = {}, defaultdict(int)

    def execute(t):
        numerics(t)
        if t.op == Op.ROUTER_TOPK:
            live[t.layer] = len(numerics.slot_expert)
        if t.op in (Op.MOE_UPGATE, Op.MOE_DOWN):
            ran[t.layer] += 1

    with torch.no_grad():
        simulate.run(s, execute, live_slots=numerics.layer_active.__getitem__)
    tiles = TINY_I // s.tiles.moe_up_cols + dims.hidden // s.tiles.moe_down_rows
    assert live and all(n < moe_slots(dims, 3) for n in live.values())
    assert dict(ran) == {layer: n * tiles for layer, n in live.items()}


@pytest.mark.parametrize("batch, order, reserved", [(1, "random", 2), (3, "reverse", 1)])
def test_routing_sms_hold_each_moe_layers_routing_and_nothing_else_of_it(dims, weights, batch, order, reserved):
    """StepShape.routing_sms: every MoE layer's router tasks and top-k on SMs 0 .. reserved - 1 and its other
    tasks on the rest; the dense layer and the final norm dealt over all SMs; the default attention split
    counts only the SMs left; the step is deadlock- and race-free and computes exactly what the plain
    dealing computes."""
    gen = torch.Generator().manual_seed(batch)
    lengths = [5, 9, 2][:batch]
    sim = PagedKVSim(dims, num_requests=batch, max_len=max(lengths) + 1, block_size=4, seed=batch)
    sim.fill_history(lengths, generator=gen)
    inp = sim.step([int(torch.randint(0, dims.vocab, (1,), generator=gen)) for _ in lengths])
    shape = dict(batch=batch, num_sms=6, attn_min_tiles=1)
    plain = build_schedule(dims, StepShape(**shape), *weights.intermediates())
    routed = build_schedule(dims, StepShape(**shape, routing_sms=reserved), *weights.intermediates())
    assert routed.shape.attn_splits == layout.attn_splits_for(batch, 6 - reserved)
    moe = [t for t in routed.tasks if t.layer < dims.num_layers and not dims.dense[t.layer]]
    assert moe and all((t.sm < reserved) == (t.wave in ("router", "router_topk")) for t in moe)
    rest = [t for t in routed.tasks if t not in moe]
    assert rest and any(t.sm < reserved for t in rest)  # the dense layer uses every SM
    assert all(lst == sorted(lst) for lst in routed.sm_tasks)
    simulate.check_races(routed, order=order, seed=batch)
    # the same attention split as plain's, so that the two compute in the same order
    same_splits = build_schedule(dims, StepShape(**shape, routing_sms=reserved, attn_splits=plain.shape.attn_splits),
                                 *weights.intermediates())
    assert [t.fields for t in same_splits.tasks] == [t.fields for t in plain.tasks]  # only the dealing differs
    assert [t.sm for t in same_splits.tasks] != [t.sm for t in plain.tasks]
    got = simulate.decode_step(same_splits, weights, clone_inputs(inp), order=order, seed=batch)
    want = simulate.decode_step(plain, weights, clone_inputs(inp), order=order, seed=batch)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(simulate.decode_step(routed, weights, clone_inputs(inp), order=order, seed=batch),
                               ref.decode_step(dims, weights, clone_inputs(inp)), atol=1e-4, rtol=1e-4)
    for bad in (-1, 6):
        with pytest.raises(ValueError, match="routing_sms"):
            StepShape(**shape, routing_sms=bad)


@pytest.mark.parametrize("batch, order", [(1, "random"), (2, "reverse")])
def test_descending_split_order_deals_each_requests_last_split_first_and_computes_the_same(dims, weights, batch,
                                                                                             order):
    """StepShape.split_order="descending": each request's ATTN_PARTIAL tasks are created (so dealt) last split
    first, so the splits a short context fills sit on the SMs dealt last in the wave and the next wave's extra
    places go to the SMs of empty splits; the same tasks otherwise, deadlock- and race-free, and the step's
    result bit-equal to the ascending order's (each split writes its own partial)."""
    inp = step_inputs(dims, [9, 3][:batch], seed=batch)
    shape = dict(batch=batch, num_sms=5, attn_splits=3, attn_min_tiles=1)
    up = build_schedule(dims, StepShape(**shape, split_order="ascending"), *weights.intermediates())
    down = build_schedule(dims, StepShape(**shape, split_order="descending"), *weights.intermediates())
    assert StepShape(**shape).split_order == "descending"  # the default where the live split cap is on
    assert StepShape(**shape, attn_live_tasks=0).split_order == "ascending"

    def splits(s):
        return [(t.fields["request"], t.fields["split"]) for t in s.tasks if t.op == Op.ATTN_PARTIAL and t.layer == 0]

    assert splits(up) == [(r, k) for r in range(batch) for k in range(3)]
    assert splits(down) == [(r, k) for r in range(batch) for k in (2, 1, 0)]
    def task_set(s):
        return sorted((t.op, t.layer, tuple(sorted(t.fields.items()))) for t in s.tasks)

    assert task_set(down) == task_set(up)
    assert_race_free_and_bit_equal(down, up, weights, inp, order, batch)
    with pytest.raises(ValueError, match="split_order"):
        StepShape(**shape, split_order="sideways")


@pytest.mark.parametrize("batch, live_tasks, order", [(1, 2, "random"), (2, 2, "reverse"), (3, 4, "random")])
def test_a_live_split_cap_runs_attention_on_fewer_longer_splits_and_matches_the_reference(dims, weights, batch,
                                                                                          live_tasks, order):
    """StepShape.attn_live_tasks: at most live_tasks // batch splits per request hold keys (up to attn_max_tiles
    a split), the others return at once; the step is race-free and matches the reference, and the splits
    the simulator ran are layout.attn_split_tiles' (the kernel's formula) with the cap."""
    lengths = [100, 37, 70][:batch]  # 7, 3 and 5 tiles of 16 tokens
    inp = step_inputs(dims, lengths, seed=batch)
    shape = StepShape(batch=batch, num_sms=5, attn_splits=4, attn_min_tiles=1, attn_live_tasks=live_tasks,
                      attn_max_tiles=8)
    assert shape.attn_live_splits == max(1, live_tasks // batch)
    sched = build_schedule(dims, shape, *weights.intermediates())
    simulate.check_races(sched, order=order, seed=batch)
    used = [layout.attn_split_tiles(n + 1, None, 4, 1, shape.attn_live_splits, 8)[2] for n in lengths]
    plain = [layout.attn_split_tiles(n + 1, None, 4, 1)[2] for n in lengths]
    assert all(u <= shape.attn_live_splits for u in used) and used != plain
    torch.testing.assert_close(simulate.decode_step(sched, weights, clone_inputs(inp), order=order, seed=batch),
                               ref.decode_step(dims, weights, clone_inputs(inp)), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="attn_live_tasks"):
        StepShape(batch=batch, num_sms=5, attn_live_tasks=-2)


@pytest.mark.parametrize("batch, order", [(1, "random"), (2, "reverse")])
def test_combines_placed_on_empty_splits_sit_on_the_highest_splits_sms_and_compute_the_same(dims, weights, batch,
                                                                                             order):
    """StepShape.combine_place="empty_splits": each layer's ATTN_COMBINE tasks go to the SMs of its highest
    splits (highest first, then request), and every other task keeps its round-robin SM; every SM's list
    stays in step order, the step is race-free and bit-equal to the round-robin placement's."""
    inp = step_inputs(dims, [40, 9][:batch], seed=batch)
    shape = dict(batch=batch, num_sms=7, attn_splits=3, attn_min_tiles=1)
    plain = build_schedule(dims, StepShape(**shape, combine_place="round_robin"), *weights.intermediates())
    placed = build_schedule(dims, StepShape(**shape, combine_place="empty_splits"), *weights.intermediates())
    assert [t.fields for t in placed.tasks] == [t.fields for t in plain.tasks]
    for layer in range(dims.num_layers):
        splits = sorted((-t.fields["split"], t.fields["request"], t.sm) for t in placed.tasks
                        if t.op == Op.ATTN_PARTIAL and t.layer == layer)
        combines = [t.sm for t in placed.tasks if t.op == Op.ATTN_COMBINE and t.layer == layer]
        assert combines == [splits[i % len(splits)][2] for i in range(len(combines))]
        rest = [(t.index, t.sm) for t in placed.tasks if t.layer == layer and t.op != Op.ATTN_COMBINE]
        assert rest == [(t.index, t.sm) for t in plain.tasks if t.layer == layer and t.op != Op.ATTN_COMBINE]
    assert any(a.sm != b.sm for a, b in zip(placed.tasks, plain.tasks))
    assert all(lst == sorted(lst) for lst in placed.sm_tasks)
    assert_race_free_and_bit_equal(placed, plain, weights, inp, order, batch)
    with pytest.raises(ValueError, match="combine_place"):
        StepShape(**shape, combine_place="anywhere")


def test_only_batch_2_places_its_combines_on_empty_splits_by_default():
    """layout.combine_place_for: measured -3.0% at batch 2, nothing at 1, +0.7% at 4 (session U); a shape that
    leaves combine_place out takes it, one that names it keeps its own."""
    assert [StepShape(batch=b, num_sms=132).combine_place for b in (1, 2, 3, 4, 8, 64)] == \
        ["round_robin", "empty_splits", "round_robin", "round_robin", "round_robin", "round_robin"]
    assert StepShape(batch=2, num_sms=132, combine_place="round_robin").combine_place == "round_robin"


def _computes_the_plain_step(sched, plain, weights, inp, order, seed, uniform):
    """One step through ``sched`` is bit-equal to the same step through ``plain`` (the top-k's work list on its
    barrier) and matches the reference."""
    dims = sched.dims
    got = simulate.decode_step(sched, weights, clone_inputs(inp), order=order, seed=seed, uniform_routing=uniform)
    want = simulate.decode_step(plain, weights, clone_inputs(inp), order=order, seed=seed, uniform_routing=uniform)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    expected = ref.decode_step(dims, weights, clone_inputs(inp), uniform_routing=uniform)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch, order, uniform", [(1, "random", False), (3, "reverse", False), (4, "random", True),
                                                   (8, "random", False)])
def test_local_routing_waits_on_the_router_wave_and_computes_the_same_step(dims, weights, batch, order, uniform):
    """StepShape.local_routing: every expert task's producer waits on its layer's router wave (not the
    top-k) and reads the layer's scores, the MoE combine waits on the top-k for its weights, and nothing
    else changes: the step is deadlock- and race-free, runs exactly the live slots' tiles (a padding row
    leaves slots dead), and is bit-equal to the top-k's work list's step, routed or with uniform routing."""
    lengths = [40, 9, 3, 17, 1, 30, 12][: max(batch - 1, 1)]
    inp = step_inputs(dims, lengths + [0] * (batch - len(lengths)), seed=batch)  # a padding row from batch 2
    shape = dict(batch=batch, num_sms=7, attn_splits=3, attn_min_tiles=1)
    plain = build_schedule(dims, StepShape(**shape, local_routing=False), *weights.intermediates())
    local = build_schedule(dims, StepShape(**shape, local_routing=True), *weights.intermediates())
    for layer in range(dims.num_layers):
        if dims.dense[layer]:
            continue
        names = {b: local.barriers[b].name for b in range(len(local.barriers))}
        experts = [t for t in local.tasks if t.layer == layer and t.op in (Op.MOE_UPGATE, Op.MOE_DOWN)]
        assert {names[t.load_wait] for t in experts} == {f"L{layer}.router"}
        assert all(names[w] != f"L{layer}.route" for t in experts for w in t.waits)
        assert all(("scores", layer) in t.reads and ("route",) not in t.reads for t in experts)
        combines = [t for t in local.tasks if t.layer == layer and t.op == Op.MOE_COMBINE]
        assert combines and all(f"L{layer}.route" in {names[w] for w in t.waits} for t in combines)
    assert [t.op for t in local.tasks] == [t.op for t in plain.tasks]
    simulate.run(local, order=order, seed=batch)
    simulate.check_races(local, order=order, seed=batch)
    numerics = simulate.Numerics(local, weights, clone_inputs(inp), uniform_routing=uniform)
    with torch.no_grad():
        ran = simulate.run(local, numerics, order=order, seed=batch, live_slots=numerics.live_slots)
    live = {layer: numerics.layer_active[layer] for layer in numerics.layer_active}
    expert = [local.tasks[i] for i in ran if local.tasks[i].op in (Op.MOE_UPGATE, Op.MOE_DOWN)]
    assert expert and all(t.fields["slot"] < live[t.layer] for t in expert)
    if batch > 1:
        assert any(n < moe_slots(dims, batch) for n in live.values())  # some slots dead, skipped
    _computes_the_plain_step(local, plain, weights, inp, order, batch, uniform)


def test_local_routing_keeps_every_layers_scores_and_is_refused_where_the_kernel_has_no_form(dims):
    """A producer can reach a layer's expert place after the layer finished (a dead tile) and must still read
    that layer's scores: the workspace keeps them per layer. The producer's routing scratch holds
    LOCAL_ROUTING_MAX_BATCH rows, and the MoE combine's wait on the top-k needs a MoE combine wave."""
    spec = layout.workspace_spec(dims, 3, 2, TINY_I, TINY_DENSE_I)
    assert spec["scores"][0] == (dims.num_layers, 3, dims.num_experts)
    n = layout.LOCAL_ROUTING_MAX_BATCH
    assert StepShape(batch=n, num_sms=7, local_routing=True).local_routing
    with pytest.raises(ValueError, match="local_routing"):
        StepShape(batch=n + 1, num_sms=7, local_routing=True)
    with pytest.raises(ValueError, match="local_routing"):
        StepShape(batch=2, num_sms=7, local_routing=True, norm="wave", combine_in_norm=True)
    assert [StepShape(batch=b, num_sms=132).local_routing for b in (1, 2, 8, 64)] == \
        [layout.local_routing_for(b) for b in (1, 2, 8, 64)]


@pytest.mark.parametrize("batch, order, uniform", [(1, "random", False), (3, "reverse", False), (4, "random", True),
                                                   (8, "random", False)])
def test_posted_routing_polls_the_layers_top_k_and_computes_the_same_step(dims, weights, batch, order, uniform):
    """StepShape.posted_routing: every expert task's producer waits on its layer's router wave and then polls
    the layer's top-k's posted words (Task.load_post; no barrier between them), the MoE combine waits on the
    top-k for its weights, and nothing else changes: the step is deadlock- and race-free under any SM order,
    runs exactly the live slots' tiles as the posted words decode them (a padding row leaves slots dead), and
    is bit-equal to the step on the top-k's barrier and to the reference."""
    from vllm_megakernel.megakernel.schedule import POSTED_ROUTES

    lengths = [40, 9, 3, 17, 1, 30, 12][: max(batch - 1, 1)]
    inp = step_inputs(dims, lengths + [0] * (batch - len(lengths)), seed=batch)  # a padding row from batch 2
    shape = dict(batch=batch, num_sms=7, attn_splits=3, attn_min_tiles=1)
    plain = build_schedule(dims, StepShape(**shape, posted_routing=False), *weights.intermediates())
    posted = build_schedule(dims, StepShape(**shape, posted_routing=True), *weights.intermediates())
    names = {b: posted.barriers[b].name for b in range(len(posted.barriers))}
    for layer in range(dims.num_layers):
        if dims.dense[layer]:
            continue
        topk = [t for t in posted.tasks if t.layer == layer and t.op == Op.ROUTER_TOPK]
        assert len(topk) == 1 and (POSTED_ROUTES, layer) in topk[0].writes
        experts = [t for t in posted.tasks if t.layer == layer and t.op in (Op.MOE_UPGATE, Op.MOE_DOWN)]
        assert {names[t.load_wait] for t in experts} == {f"L{layer}.router"}
        assert {t.load_post for t in experts} == {topk[0].index}
        assert all(names[w] != f"L{layer}.route" for t in experts for w in t.waits)
        assert all((POSTED_ROUTES, layer) in t.reads and ("route",) not in t.reads for t in experts)
        combines = [t for t in posted.tasks if t.layer == layer and t.op == Op.MOE_COMBINE]
        assert combines and all(f"L{layer}.route" in {names[w] for w in t.waits} for t in combines)
    assert all(t.load_post == -1 for t in plain.tasks)
    assert [t.op for t in posted.tasks] == [t.op for t in plain.tasks]
    assert posted.route_post_words == dims.num_layers * (1 + moe_slots(dims, batch)) and plain.route_post_words == 0
    simulate.run(posted, order=order, seed=batch)
    simulate.check_races(posted, order=order, seed=batch)
    numerics = simulate.Numerics(posted, weights, clone_inputs(inp), uniform_routing=uniform)
    with torch.no_grad():
        ran = simulate.run(posted, numerics, order=order, seed=batch, live_slots=numerics.live_slots)
    assert set(numerics.posts) == {layer for layer in range(dims.num_layers) if not dims.dense[layer]}
    expert = [posted.tasks[i] for i in ran if posted.tasks[i].op in (Op.MOE_UPGATE, Op.MOE_DOWN)]
    assert expert and all(t.fields["slot"] < numerics.posts[t.layer][0] for t in expert)
    if batch > 1:
        assert any(words[0] < moe_slots(dims, batch) for words in numerics.posts.values())  # dead slots, skipped
    _computes_the_plain_step(posted, plain, weights, inp, order, batch, uniform)


def test_a_posted_word_read_without_polling_its_writer_or_written_twice_is_a_race_and_a_later_writer_deadlocks(dims):
    """The posted words need no barrier only because a producer polls them until their own flag is set:
    simulate.check_races refuses an expert task that reads them without polling the top-k that posts them, and
    a second writer of them; the producer model refuses a poll of a task that comes later in the step."""
    import dataclasses

    from vllm_megakernel.megakernel.schedule import POSTED_ROUTES

    s = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2, attn_min_tiles=1, posted_routing=True),
                       TINY_I, TINY_DENSE_I)
    simulate.check_races(s)
    victim = next(t for t in s.tasks if t.op == Op.MOE_DOWN)
    mute = dataclasses.replace(s, tasks=[dataclasses.replace(t, load_post=-1) if t is victim else t for t in s.tasks])
    with pytest.raises(simulate.RaceError, match="without polling"):
        simulate.check_races(mute)
    router = next(t for t in s.tasks if t.op == Op.ROUTER and t.layer == victim.layer)
    twice = dataclasses.replace(s, tasks=[dataclasses.replace(t, writes=t.writes + ((POSTED_ROUTES, t.layer),))
                                          if t is router else t for t in s.tasks])
    with pytest.raises(simulate.RaceError, match="written by 2 tasks"):
        simulate.check_races(twice)
    late = max(t.index for t in s.tasks if t.layer == victim.layer)
    ahead = dataclasses.replace(s, tasks=[dataclasses.replace(t, load_post=late) if t is victim else t
                                          for t in s.tasks])
    with pytest.raises(simulate.Deadlock, match="not earlier in the step"):
        simulate.run(ahead)


@pytest.mark.parametrize("batch, order, num_sms", [(1, "random", 7), (2, "reverse", 5), (3, "reverse", 13),
                                                   (8, "random", 40)])
def test_posted_scores_let_the_top_k_poll_the_router_wave_and_compute_the_same_step(dims, weights, batch, order,
                                                                                   num_sms):
    """StepShape.posted_scores (with posted routing): each layer's top-k keeps the router wave as its wait in the
    schedule, which the kernel satisfies by polling the routers' keys (Task.polls_inputs), and no other task
    changes; the step is deadlock- and race-free under any SM order on few and many SMs and bit-equal to the same
    step without it, and the step's barrier array grows by one key a score of every layer."""
    lengths = [40, 9, 3, 17, 1, 30, 12][: max(batch - 1, 1)]
    inp = step_inputs(dims, lengths + [0] * (batch - len(lengths)), seed=batch)  # a padding row from batch 2
    shape = dict(batch=batch, num_sms=num_sms, attn_splits=3, attn_min_tiles=1, posted_routing=True)
    plain = build_schedule(dims, StepShape(**shape, posted_scores=False), *weights.intermediates())
    polled = build_schedule(dims, StepShape(**shape, posted_scores=True), *weights.intermediates())
    names = {b: polled.barriers[b].name for b in range(len(polled.barriers))}
    topks = [t for t in polled.tasks if t.op == Op.ROUTER_TOPK]
    assert topks and all(t.polls_inputs and [names[w] for w in t.waits] == [f"L{t.layer}.router"] for t in topks)
    assert [t for t in polled.tasks if t.polls_inputs] == topks and not any(t.polls_inputs for t in plain.tasks)
    strip = [dataclasses.replace(t, polls_inputs=False) for t in polled.tasks]
    assert strip == plain.tasks and polled.sm_tasks == plain.sm_tasks
    assert polled.score_post_words == dims.num_layers * batch * dims.num_experts and plain.score_post_words == 0
    simulate.run(polled, order=order, seed=batch)
    for o in ("round_robin", "reverse", "random"):
        simulate.check_races(polled, order=o, seed=batch)
    _computes_the_plain_step(polled, plain, weights, inp, order, batch, False)


def test_a_task_after_the_polling_top_k_on_its_sm_does_not_inherit_the_router_waves_writes(dims):
    """A poll orders only the words it read (simulate.HappensBefore): a task placed after the top-k on its SM that
    reads a router's float scores with no wait of its own is ordered after that router when the top-k waited on
    the router wave's barrier, and races with it when the top-k polled the keys instead."""
    for polled in (False, True):
        s = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2, attn_min_tiles=1, posted_routing=True,
                                           posted_scores=polled), TINY_I, TINY_DENSE_I)
        topk = next(t for t in s.tasks if t.op == Op.ROUTER_TOPK)
        router = next(t for t in s.tasks if t.op == Op.ROUTER and t.layer == topk.layer and t.sm != topk.sm)
        reader = Task(len(s.tasks), Op.NORM, topk.layer, "extra", {}, (), NO_BARRIER, router.writes[:1], (),
                      sm=topk.sm)
        s.tasks.append(reader)
        lst = s.sm_tasks[topk.sm]
        lst.insert(lst.index(topk.index) + 1, reader.index)
        if not polled:
            simulate.check_races(s)
            continue
        with pytest.raises(simulate.RaceError, match="scores"):
            simulate.check_races(s)


def test_posted_scores_are_refused_without_posted_routing(dims):
    """Without posted routing the expert tasks wait on the top-k's barrier alone, and the top-k, which polled only
    the routers' keys, passes nothing else of theirs on (the up/gate tasks' hn rows): such a step races, and
    StepShape refuses it (so too past posted routing's batches and with local routing). With posted routing the
    producers wait on the router wave; the default is layout's, where posted routing is on."""
    n = layout.POSTED_ROUTING_MAX_BATCH
    assert StepShape(batch=n, num_sms=7, posted_routing=True, posted_scores=True).posted_scores
    for bad in (dict(batch=n + 1), dict(batch=2, local_routing=True), dict(batch=2, posted_routing=False)):
        with pytest.raises(ValueError, match="posted_scores"):
            StepShape(num_sms=7, posted_scores=True, **bad)
    assert [StepShape(batch=b, num_sms=132).posted_scores for b in (1, 2, 8, 64)] == \
        [layout.posted_scores_for(b) and layout.posted_routing_for(b) for b in (1, 2, 8, 64)]
    # what the refusal prevents: the same schedule forced past the check races on hn
    s = build_schedule(dims, StepShape(batch=2, num_sms=13, attn_splits=2, attn_min_tiles=1, posted_routing=False),
                       TINY_I, TINY_DENSE_I)
    forced = dataclasses.replace(s, tasks=[dataclasses.replace(t, polls_inputs=t.op == Op.ROUTER_TOPK)
                                           for t in s.tasks])
    simulate.check_races(s)
    with pytest.raises(simulate.RaceError, match="hn"):
        simulate.check_races(forced)


def test_posted_routing_is_refused_where_the_kernel_has_no_form_and_its_words_pack_every_row(dims):
    """A slot's posted word holds up to POSTED_ROUTING_MAX_BATCH rows below its posted bit (abi.ROUTE_POST),
    and the MoE combine's wait on the top-k needs a MoE combine wave: other shapes are refused, as is posted
    routing with local routing. The words round-trip through abi's packing at the extremes."""
    n = layout.POSTED_ROUTING_MAX_BATCH
    assert StepShape(batch=n, num_sms=7, posted_routing=True).posted_routing
    for bad in (dict(batch=n + 1), dict(batch=2, norm="wave", combine_in_norm=True), dict(batch=2, local_routing=True)):
        with pytest.raises(ValueError, match="posted_routing"):
            StepShape(num_sms=7, posted_routing=True, **bad)
    assert [StepShape(batch=b, num_sms=132).posted_routing for b in (1, 2, 8, 64)] == \
        [layout.posted_routing_for(b) and not layout.local_routing_for(b) for b in (1, 2, 8, 64)]
    K, E = abi.MODEL["top_k"], abi.MODEL["num_experts"]
    for expert, rows in ((0, []), (E - 1, list(range(n * K - n, n * K))), (5, [0]), (E // 2, [3, 9, 63][:n])):
        word = abi.pack_route_post(expert, rows)
        assert word >> abi.ROUTE_POST["posted_bit"] == 1 and abi.unpack_route_post(word) == (expert, rows)
    assert abi.unpack_route_post(0) is None


@pytest.mark.parametrize("batch, live_tasks, order", [(1, 2, "random"), (2, 2, "reverse"), (3, 3, "random")])
def test_live_first_deals_the_live_splits_right_after_qkv_and_the_experts_after_them(dims, weights, batch, live_tasks,
                                                                                     order):
    """split_order="live_first": each layer's partials are dealt split by split (every request's split 0, then
    split 1, ...), so the cap's live splits take the SMs right after the layer's earlier waves, and the wave
    after the partials goes on from the last live split, not from the last partial: the SMs of the empty
    splits get its extra places. Every SM's list stays in step order; the step is race-free and bit-equal to
    the descending deal's."""
    inp = step_inputs(dims, [40, 9, 23][:batch], seed=batch)
    shape = dict(batch=batch, num_sms=7, attn_splits=3, attn_min_tiles=1, attn_live_tasks=live_tasks)
    plain = build_schedule(dims, StepShape(**shape, split_order="descending"), *weights.intermediates())
    first = build_schedule(dims, StepShape(**shape, split_order="live_first"), *weights.intermediates())
    live = first.shape.attn_live_splits * batch
    for layer in range(dims.num_layers):
        partials = [t for t in first.tasks if t.layer == layer and t.op == Op.ATTN_PARTIAL]
        assert [(t.fields["split"], t.fields["request"]) for t in partials] == \
            sorted((t.fields["split"], t.fields["request"]) for t in partials)
        nxt = first.tasks[partials[-1].index + 1]
        assert nxt.sm == (partials[0].sm + live) % 7  # the next wave starts after the live splits' SMs
    assert all(lst == sorted(lst) for lst in first.sm_tasks)
    assert_race_free_and_bit_equal(first, plain, weights, inp, order, batch)


@pytest.mark.parametrize("op", ["MOE_UPGATE", "MOE_DOWN"])
def test_a_claimed_wave_out_of_slot_and_tile_order_is_refused(dims, op):
    """A claiming producer takes the wave's n-th task as tile n % tiles of slot n / tiles: a wave whose tasks
    are not in that order (two tiles swapped) or whose task waits on another slot's barrier is refused."""
    from vllm_megakernel.megakernel.schedule import _check_claim_waves

    s = build_schedule(dims, StepShape(batch=3, num_sms=5, expert_claims=True), TINY_I, TINY_DENSE_I)
    _check_claim_waves(s.tasks, TINY_I, dims.hidden)
    wave = [t for t in s.tasks if t.op.name == op and t.layer == 1]
    first = "col0" if op == "MOE_UPGATE" else "row0"
    a, b = wave[0], wave[-1]  # the first and the last tile trade places (slot and first column / row)
    swap = {a.index: b, b.index: a}
    swapped = [dataclasses.replace(t, fields={**t.fields, "slot": swap[t.index].fields["slot"],
                                              first: swap[t.index].fields[first]}) if t.index in swap else t
               for t in s.tasks]
    with pytest.raises(AssertionError, match="th tile of its claimed wave"):
        _check_claim_waves(swapped, TINY_I, dims.hidden)
    last = wave[-1]  # the last slot's task, on the first slot's barrier
    assert last.fields["slot"] > wave[0].fields["slot"]
    bad = dataclasses.replace(last, signal=wave[0].signal) if op == "MOE_UPGATE" else \
        dataclasses.replace(last, waits=(wave[0].waits[0],))
    moved = [bad if t is last else t for t in s.tasks]
    with pytest.raises(AssertionError, match=f"task {last.index} .* is not the"):
        _check_claim_waves(moved, TINY_I, dims.hidden)

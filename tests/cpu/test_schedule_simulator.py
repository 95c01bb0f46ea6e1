"""The schedule, proven on the CPU: exact barrier counts, no deadlock under any interleaving, every
conflicting access ordered, and the step computed task by task equal to the reference decode step."""

import dataclasses

import pytest
import torch

from conftest import FULL_CONFIG, TINY_CONFIG
from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel import simulate
from vllm_megakernel.megakernel.abi import NO_BARRIER, Op
from vllm_megakernel.megakernel.schedule import StepShape, build_schedule, moe_slots
from vllm_megakernel.paged_kv import PagedKVSim

TINY_I, TINY_DENSE_I = 32, 96  # intermediate_size, prefix_dense_intermediate_size of the tiny config


@pytest.fixture(scope="module")
def dims():
    return ref.ModelDims.from_config(TINY_CONFIG)


def tiny_schedule(dims, batch, num_sms=5, splits=2):
    return build_schedule(dims, StepShape(batch=batch, num_sms=num_sms, tile_n=16, attn_splits=splits),
                          TINY_I, TINY_DENSE_I)


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("order", ["round_robin", "random", "reverse"])
def test_every_barrier_reaches_exactly_its_target(dims, batch, order):
    s = tiny_schedule(dims, batch)
    done = simulate.run(s, order=order, seed=batch)
    assert sorted(done) == list(range(len(s.tasks)))


@pytest.mark.parametrize("batch", [1, 3])
def test_no_two_conflicting_tasks_are_unordered(dims, batch):
    simulate.check_races(tiny_schedule(dims, batch))


def test_waves_follow_the_named_order_within_a_layer(dims):
    s = tiny_schedule(dims, 2)
    waves = []
    for t in s.tasks:
        if t.layer == 1 and (not waves or waves[-1] != t.wave):
            waves.append(t.wave)
    assert waves == ["norm", "qkv", "router", "attn_partial", "mlp_up", "attn_combine", "mlp_down",
                     "o_proj", "moe_combine"]
    assert {t.sm for t in s.tasks} == set(range(5))  # round-robin reaches every SM


def test_barrier_targets_are_derived_from_the_schedule(dims):
    B, K = 3, dims.top_k
    s = tiny_schedule(dims, B, splits=2)
    by_name = {b.name: b.target for b in s.barriers}
    group = dims.num_heads // dims.num_kv_heads
    assert by_name["L1.qkv.g0"] == group + 2  # its query heads, its k head, its v head
    assert by_name["L1.attn.r2.g1"] == 2  # one per split
    assert by_name["L1.attn_combine"] == B * dims.num_kv_heads
    assert by_name["L1.moe_up.s0"] == TINY_I // 16
    assert by_name["L1.moe_down"] == moe_slots(dims, B) * dims.hidden // 16
    assert moe_slots(dims, B) == min(dims.num_experts, B * K)
    assert by_name["L0.dense_up"] == TINY_DENSE_I // 16


def test_a_missing_signal_is_reported_as_a_deadlock_naming_the_barrier(dims):
    s = tiny_schedule(dims, 2)
    victim = next(t for t in s.tasks if t.op == Op.MOE_UPGATE and t.layer == 2)
    victim.signal = NO_BARRIER  # the target stays, one arrival goes missing
    with pytest.raises(simulate.Deadlock, match=r"waits on L2\.moe_up\.s0: expected 2, seen 1"):
        simulate.run(s)


def test_an_extra_signal_is_reported_as_overflow(dims):
    s = tiny_schedule(dims, 2)
    qkv_bar = next(t.signal for t in s.tasks if t.op == Op.QKV_ROPE and t.layer == 3)
    extra = next(t for t in s.tasks if t.op == Op.O_PROJ and t.layer == 3)
    extra.signal = qkv_bar
    s.barriers[next(t.signal for t in s.tasks if t.op == Op.O_PROJ and t.layer == 3 and t is not extra)].target -= 1
    with pytest.raises((simulate.BarrierOverflow, simulate.Deadlock)):
        simulate.run(s)


def test_a_dropped_dependency_is_caught_as_a_race(dims):
    s = tiny_schedule(dims, 2)
    combine = next(t for t in s.tasks if t.op == Op.MOE_COMBINE and t.layer == 2)
    combine.waits = ()  # would read expert outputs before they are written
    with pytest.raises(simulate.RaceError, match="eout"):
        simulate.check_races(s)


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


@pytest.mark.parametrize("batch, splits, order", [(1, 1, "round_robin"), (4, 3, "random"), (5, 2, "reverse")])
def test_step_through_schedule_matches_reference(dims, weights, batch, splits, order):
    """Ragged lengths (below, at and above the window), one padding row, KV written through the cache."""
    gen = torch.Generator().manual_seed(batch * 10 + splits)
    window = dims.sliding_window
    lengths = [1, window, window + 1, 3 * window + 2][: batch - 1] if batch > 1 else [2 * window + 3]
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
    sched = build_schedule(dims, StepShape(batch=batch, num_sms=7, tile_n=16, attn_splits=splits),
                           *weights.intermediates())
    got = simulate.decode_step(sched, weights, mk_inp, order=order, seed=splits)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for a, b in zip(ref_inp.kv_caches, mk_inp.kv_caches):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, equal_nan=True)  # same K/V, same slots
    assert torch.isfinite(got).all()


def test_full_model_schedule_at_batch_1_is_consistent():
    """North Mini Code itself: 49 layers, 132 SMs -- counts, deadlock freedom, races, the ABI encoding."""
    full = ref.ModelDims.from_config(FULL_CONFIG)
    s = build_schedule(full, StepShape(batch=1, num_sms=132, tile_n=128, attn_splits=8), 768, 3072)
    simulate.run(s, order="random", seed=0)
    simulate.check_races(s)
    enc = s.encode()
    assert enc.shape[0] == 132 and enc.shape[2] == 32
    assert int((enc[:, :, 0] != 0).sum()) == len(s.tasks)
    per_layer = sum(1 for t in s.tasks if t.layer == 5)
    # qkv 40 + router 1 + attn 4*8 + up 8*6 + combine 4 + down 8*16 + o 16 + moe combine 16 + norm 1
    assert per_layer == 40 + 1 + 32 + 48 + 4 + 128 + 16 + 16 + 1


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


def test_attention_splits_follow_context_and_shrink_with_batch():
    from vllm_megakernel.megakernel.schedule import attn_splits_for

    assert attn_splits_for(1000) == 1 and attn_splits_for(8192) == 8 and attn_splits_for(262144) == 16
    # 132 SMs, 4 KV heads: batch 1 keeps the context's splits, batch 64 needs few
    assert attn_splits_for(262144, batch=1, num_kv_heads=4, num_sms=132) == 16
    assert attn_splits_for(262144, batch=8, num_kv_heads=4, num_sms=132) == 9
    assert attn_splits_for(262144, batch=64, num_kv_heads=4, num_sms=132) == 2
    assert attn_splits_for(1000, batch=1, num_kv_heads=4, num_sms=132) == 1


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


def test_workspace_round_trip_resumes_the_step_exactly(dims, weights):
    """Run the step to the middle of a MoE layer with torch ops, store the state in the kernel's workspace
    layout, load it into a fresh interpreter, finish the step there: same output as one uninterrupted run.
    This pins load_workspace (used on the GPU to feed the kernel's own state to the torch version of the
    next wave), including the route buffer's layout."""
    from vllm_megakernel.megakernel import runtime

    batch = 3
    sim = PagedKVSim(dims, num_requests=batch, max_len=40, block_size=4, seed=5)
    sim.fill_history([30, 9, 0], generator=torch.Generator().manual_seed(5))
    inp = sim.step([7, 8, None])
    sched = build_schedule(dims, StepShape(batch=batch, num_sms=5, tile_n=16, attn_splits=2), *weights.intermediates())
    whole = simulate.decode_step(sched, weights, clone_inputs(inp))

    moe_layer = next(i for i, d in enumerate(dims.dense) if not d)
    cut = sched.wave_range(moe_layer, "mlp_down")[0]  # routed, up/gate done, down not yet
    first = clone_inputs(inp)
    a = simulate.Numerics(sched, weights, first)
    simulate.run(sched.truncated(cut), a)
    ws = runtime.allocate_workspace(dims, batch, 2, *weights.intermediates(), device="cpu", dtype=torch.float32)
    a.store_workspace(ws)
    assert int(ws["route"][0]) == len(a.slot_expert) > 0
    b = simulate.Numerics(sched, weights, first)
    b.load_workspace(ws)
    assert b.slot_expert == a.slot_expert and b.slot_rows == a.slot_rows
    for t in sched.tasks[cut:]:
        b(t)
    torch.testing.assert_close(b.out, whole, atol=0, rtol=0)

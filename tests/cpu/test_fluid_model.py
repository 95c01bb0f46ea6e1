"""megakernel.fluid, the bandwidth-aware timing model: every task runs and every byte lands, no task streams
faster than the HBM curve allows, fewer bytes in flight or less bandwidth never make a step faster, and the
routing's claims and dead slots behave as in megakernel.timing."""

import math

import pytest

from conftest import TINY_CONFIG
from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel import fluid, layout, trace
from vllm_megakernel.megakernel.abi import Op
from vllm_megakernel.megakernel.schedule import StepShape, build_schedule

TINY_I, TINY_DENSE_I = 32, 96


@pytest.fixture(scope="module")
def dims():
    return ref.ModelDims.from_config(TINY_CONFIG)


def costs_for(sched):
    return {w: fluid.WaveCost(inputs_us=0.5, stage_work_us=0.7, finish_us=0.2, tail_us=0.3)
            for w in {t.wave for t in sched.tasks}}


def step_us(timed):
    return max(e for e in timed.end if not math.isnan(e))


def test_the_bandwidth_curve_is_the_probes_between_its_points_and_flat_past_them():
    assert fluid.bandwidth_at(0.0) == 0.0
    assert fluid.bandwidth_at(2.16e6) == pytest.approx(2.71e6)
    assert fluid.bandwidth_at((2.16e6 + 4.33e6) / 2) == pytest.approx((2.71e6 + 4.14e6) / 2)
    assert fluid.bandwidth_at(1e9) == pytest.approx(4.68e6) and fluid.bandwidth_at(1e9, scale=0.5) == pytest.approx(2.34e6)


def test_a_profiles_copy_bandwidth_scales_the_curve_against_the_probe_gpus():
    """schedule_model --scale-bandwidth: an H100 profile (2.98 TB/s measured) serves 0.70 of the probe GPU's bytes
    at every depth; a profile without the figure keeps the curve as measured."""
    scale = fluid.bandwidth_scale_for({"bandwidth_bytes_per_s": 2.98e12})
    assert scale == pytest.approx(2.98 / 4.24)
    assert fluid.bandwidth_scale_for({}) == 1.0
    for mb in (1.0, 5.0, 30.0):
        assert fluid.bandwidth_at(mb * 1e6, scale=scale) == pytest.approx(scale * fluid.bandwidth_at(mb * 1e6))


def test_scaling_the_bandwidth_needs_the_fluid_model():
    from benchmarks import schedule_model

    with pytest.raises(SystemExit):
        schedule_model.main(["--model", "configs/north-mini-code", "--profile", "/nonexistent.json", "--scale-bandwidth"])


@pytest.mark.parametrize("batch", [1, 3, 5])
def test_every_task_runs_after_its_inputs_and_its_bytes_take_their_time(dims, batch):
    """The whole step finishes; each task starts no earlier than its barriers' completion (a task that polls its
    inputs' words: than their writers' bodies' end; the top-k under posted scores, batch 1-4's default, not 5's) and
    ends no earlier than its fixed costs and its bytes at the consumers' stage pace allow; an attention split past
    its request's keys streams nothing and takes no time."""
    sched = build_schedule(dims, StepShape(batch=batch, num_sms=6, attn_splits=4), TINY_I, TINY_DENSE_I)
    seq = [40 + 17 * r for r in range(batch)]
    nbytes = fluid.task_bytes(sched, seq, TINY_I, TINY_DENSE_I)
    costs = costs_for(sched)
    timed = fluid.fluid_timeline(sched, costs, nbytes, stage_us=0.4, dt_us=0.01)
    assert all(not math.isnan(timed.start[t.index]) for t in sched.tasks)
    signals, bodies = {}, {}  # a barrier's signals: each signaller's end plus its wave's tail; and the ends alone
    for t in sched.tasks:
        if t.signal >= 0:
            signals.setdefault(t.signal, []).append(timed.end[t.index] + costs[t.wave].tail_us)
            bodies.setdefault(t.signal, []).append(timed.end[t.index])
    assert any(t.polls_inputs for t in sched.tasks) == layout.posted_scores_for(batch) == (batch < 5)
    for t in sched.tasks:
        s, e, c = timed.start[t.index], timed.end[t.index], costs[t.wave]
        for b in t.waits:
            if t.polls_inputs:
                assert s >= max(bodies[b]) + 0.7 - 1e-6, t.describe()  # the last writer's body, then the hop
            elif not (t.waits_only_if_work and nbytes[t.index] == 0):
                assert s >= max(signals[b]) + 0.7 - 1e-6, t.describe()  # the last signal, then the hop
        if t.op == Op.ATTN_PARTIAL and nbytes[t.index] == 0:
            assert e == s
        elif nbytes[t.index]:
            stages = nbytes[t.index] / fluid.STAGE_BYTES
            per = 0.9 if t.op == Op.ATTN_PARTIAL else 0.4
            assert e - s >= c.inputs_us + c.finish_us + stages * per - 0.05, t.describe()
    # every streaming task's bytes: its rows (or columns) of weights, or its tiles of K and V
    qkv = next(t for t in sched.tasks if t.op == Op.QKV_ROPE)
    assert nbytes[qkv.index] == 2 * qkv.fields["rows"] * dims.hidden


def test_fewer_bytes_in_flight_or_less_bandwidth_never_make_the_step_faster(dims):
    sched = build_schedule(dims, StepShape(batch=2, num_sms=6, attn_splits=4), TINY_I, TINY_DENSE_I)
    nbytes = [1000.0 * b for b in fluid.task_bytes(sched, [300, 500], TINY_I, TINY_DENSE_I)]  # bandwidth-bound
    costs = costs_for(sched)
    run = lambda **kw: step_us(fluid.fluid_timeline(sched, costs, nbytes, dt_us=0.05, **kw))  # noqa: E731
    assert run(stages_in_flight=1) >= run(stages_in_flight=2) >= run(stages_in_flight=5) - 1e-6
    assert run(bandwidth_scale=0.5) > run(bandwidth_scale=1.0)
    # the HBM's curve bounds the whole step: every byte at the plateau at best
    assert run(bandwidth_scale=1.0) >= sum(nbytes) / fluid.bandwidth_at(1e12) - 1e-6


def test_dead_slots_are_skipped_and_their_places_end_the_claimed_wave(dims):
    """With two of the layer's slots in use, no task of a dead slot runs, every live tile runs once, and the
    model's records give a critical path whose parts sum to the period."""
    sched = build_schedule(dims, StepShape(batch=3, num_sms=6, attn_splits=4), TINY_I, TINY_DENSE_I)
    nbytes = fluid.task_bytes(sched, [40, 60, 80], TINY_I, TINY_DENSE_I)
    timed = fluid.fluid_timeline(sched, costs_for(sched), nbytes, live_slots=lambda layer: 2, dt_us=0.02)
    for t in sched.tasks:
        ran = not math.isnan(timed.start[t.index])
        assert ran == (t.op not in (Op.MOE_UPGATE, Op.MOE_DOWN) or t.fields["slot"] < 2), t.describe()
    ran = [i for lst in timed.sm_lists for i in lst]
    assert len(ran) == len(set(ran))
    layers = trace.middle_moe_layers(dims)
    p = trace.critical_path(sched, timed.records(sched), layers)
    assert sum(r.us for r in p.parts) == pytest.approx(p.period_us, abs=1e-3)


def test_under_posted_routing_the_experts_wait_for_the_top_k_selection(dims):
    """Posted routing: an expert task's barrier is the router wave's, and its producer polls the top-k's posted
    words: with a slow top-k, no up/gate task of a layer starts before that layer's top-k has chosen (its stage
    work done) plus the hop, though the router's barrier completed long before."""
    sched = build_schedule(dims, StepShape(batch=1, num_sms=6, attn_splits=4, posted_routing=True), TINY_I,
                           TINY_DENSE_I)
    costs = costs_for(sched)
    costs["router_topk"] = fluid.WaveCost(inputs_us=0.5, stage_work_us=10.0, finish_us=0.2, tail_us=0.3)
    nbytes = fluid.task_bytes(sched, [40], TINY_I, TINY_DENSE_I)
    timed = fluid.fluid_timeline(sched, costs, nbytes, dt_us=0.02)
    for t in sched.tasks:
        if t.op == Op.MOE_UPGATE and not math.isnan(timed.start[t.index]):
            topk = sched.tasks[t.load_post]
            chosen = timed.end[topk.index] - costs["router_topk"].finish_us
            assert timed.start[t.index] >= chosen + 0.7 - 1e-6, t.describe()


def test_under_posted_scores_the_top_k_starts_on_the_routers_bodies_not_their_signals(dims):
    """Posted scores: the top-k polls the routers' keys, which are in once every router's body ended, so with long
    router tails it starts a hop after the last router's body ends and before that router's signal lands; without
    posted scores it waits for the signal."""
    costs = None
    for polled in (False, True):
        sched = build_schedule(dims, StepShape(batch=1, num_sms=6, attn_splits=4, posted_routing=True,
                                               posted_scores=polled), TINY_I, TINY_DENSE_I)
        costs = costs or costs_for(sched)
        costs["router"] = fluid.WaveCost(inputs_us=0.5, stage_work_us=0.5, finish_us=0.2, tail_us=5.0)
        nbytes = fluid.task_bytes(sched, [40], TINY_I, TINY_DENSE_I)
        timed = fluid.fluid_timeline(sched, costs, nbytes, hop_us=0.7, dt_us=0.02)
        for topk in (t for t in sched.tasks if t.op == Op.ROUTER_TOPK):
            bodies = max(timed.end[t.index] for t in sched.tasks if t.op == Op.ROUTER and t.layer == topk.layer)
            began = timed.start[topk.index]
            if polled:
                assert bodies + 0.7 - 1e-6 <= began < bodies + 5.0, topk.describe()
            else:
                assert began >= bodies + 5.0 + 0.7 - 1e-6, topk.describe()


@pytest.mark.parametrize("shape", [dict(), dict(posted_routing=True), dict(local_routing=True),
                                   dict(posted_routing=True, posted_scores=True)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_critical_path_of_any_fluid_run_sums_to_the_period(dims, shape, seed):
    """Random per-wave costs, bytes and model parameters, in three schedule shapes: trace.critical_path's parts of
    the model's run (its records with the waves' tails) always sum to the period, and the path is one per layer."""
    import random

    rnd = random.Random(seed)
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=3, **shape), TINY_I, TINY_DENSE_I)
    costs = {w: fluid.WaveCost(rnd.uniform(0, 2), rnd.uniform(0, 3), rnd.uniform(0, 2), rnd.uniform(0, 1.5))
             for w in {t.wave for t in sched.tasks}}
    nbytes = [b * rnd.uniform(0.5, 50) for b in fluid.task_bytes(sched, [rnd.randint(1, 90), rnd.randint(1, 90)],
                                                                   TINY_I, TINY_DENSE_I)]
    timed = fluid.fluid_timeline(sched, costs, nbytes, latency_us=rnd.uniform(0.3, 2), hop_us=rnd.uniform(0.1, 1.5),
                                 gap_us=rnd.uniform(0, 1), stages_in_flight=rnd.choice([1, 2, 5]), dt_us=0.05,
                                 live_slots=lambda layer: 2 + layer % 2)
    layers = trace.middle_moe_layers(dims)
    p = trace.critical_path(sched, timed.records(sched, {w: c.tail_us for w, c in costs.items()}), layers)
    assert sum(r.us for r in p.parts) == pytest.approx(p.period_us, abs=1e-3)
    assert sum(k for _, k in p.chains) == len(layers)


def _overlapping_tasks_on_an_sm(sched, timed):
    """Pairs of tasks of one SM whose [start, end) overlap (each SM's list in order: a task and the next one)."""
    return [(a, b) for lst in timed.sm_lists for a, b in zip(lst, lst[1:])
            if timed.start[b] < timed.end[a] - 1e-9 and timed.end[b] > timed.start[b]]


def test_two_consumer_groups_overlap_fixed_costs_but_take_the_ring_in_task_order(dims):
    """groups=2 (PERF_LOG #206): an SM's next task starts while the previous one finishes, so tasks of one SM
    overlap where the kernel's single group never does; with no fixed costs, no work but the bytes and no gap there
    is nothing to overlap,
    and since the ring is in task order (a group takes its task's bytes only after the previous task took all of
    its own) the step is the single group's to the last step of the model. A model that let the groups take
    bytes side by side would finish a bandwidth-bound step sooner."""
    sched = build_schedule(dims, StepShape(batch=2, num_sms=6, attn_splits=4), TINY_I, TINY_DENSE_I)
    nbytes = [40.0 * b for b in fluid.task_bytes(sched, [300, 500], TINY_I, TINY_DENSE_I)]
    costs = costs_for(sched)
    one = fluid.fluid_timeline(sched, costs, nbytes, dt_us=0.02)
    two = fluid.fluid_timeline(sched, costs, nbytes, dt_us=0.02, groups=2)
    assert not _overlapping_tasks_on_an_sm(sched, one)
    assert _overlapping_tasks_on_an_sm(sched, two)
    # nothing but the bytes (a wave that streams none, the top-k, the combines, takes no time either: its work
    # would overlap the other group's stream)
    bare = {w: fluid.WaveCost(inputs_us=0.0, stage_work_us=0.0, finish_us=0.0, tail_us=c.tail_us) for w, c in costs.items()}
    kw = dict(dt_us=0.02, gap_us=0.0, stage_us=0.2)
    assert step_us(fluid.fluid_timeline(sched, bare, nbytes, groups=2, **kw)) == pytest.approx(
        step_us(fluid.fluid_timeline(sched, bare, nbytes, **kw)), abs=0.02 + 1e-9)
    with pytest.raises(ValueError, match="groups"):
        fluid.fluid_timeline(sched, costs, nbytes, groups=0)


def test_a_storer_that_finishes_in_no_time_is_a_finish_of_no_time(dims):
    """storer_finish (PERF_LOG #206): a streaming task's finish goes to the SM's storer, which signals after it;
    at a factor of 0 that is the model with no finish on the waves that stream, task for task; at a factor above 0
    the storer's finishes come one at a time after each stream, so no streaming task ends before its stream plus
    its finish at that factor."""
    sched = build_schedule(dims, StepShape(batch=3, num_sms=6, attn_splits=4), TINY_I, TINY_DENSE_I)
    nbytes = fluid.task_bytes(sched, [90, 40, 200], TINY_I, TINY_DENSE_I)
    costs = costs_for(sched)
    streaming = {t.wave for t in sched.tasks if nbytes[t.index] > 0}
    no_finish = {w: (fluid.WaveCost(c.inputs_us, c.stage_work_us, 0.0, c.tail_us) if w in streaming else c)
                 for w, c in costs.items()}
    stored = fluid.fluid_timeline(sched, costs, nbytes, dt_us=0.02, storer_finish=0.0)
    plain = fluid.fluid_timeline(sched, no_finish, nbytes, dt_us=0.02)
    assert stored.end == plain.end and stored.start == plain.start
    slow = fluid.fluid_timeline(sched, costs, nbytes, dt_us=0.02, storer_finish=3.0)
    for t in sched.tasks:
        if nbytes[t.index] > 0:
            c = costs[t.wave]
            assert slow.end[t.index] - slow.start[t.index] >= c.inputs_us + 3.0 * c.finish_us - 1e-6, t.describe()
    assert step_us(slow) > step_us(stored)

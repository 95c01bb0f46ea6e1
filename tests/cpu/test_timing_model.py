"""megakernel.timing, the CPU timing model of a schedule: tasks start as early as their SM and their barriers
allow, claims hand out every tile once, and benchmarks.schedule_model's table reads a profile's durations."""

import dataclasses
import json

import pytest

from conftest import TINY_CONFIG

from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel import timing
from vllm_megakernel.megakernel.abi import NO_BARRIER
from vllm_megakernel.megakernel.schedule import StepShape, build_schedule

TINY_I, TINY_DENSE_I = 32, 96

# The routing hop through the top-k's barrier, not its posted words (batch 2's default until session AR, PERF_LOG
# #194): these tests time that form's waits and hops.
BARRIER_ROUTED = dict(posted_routing=False)


@pytest.fixture(scope="module")
def dims():
    return ref.ModelDims.from_config(TINY_CONFIG)


def durations_for(sched, scale=1.0):
    waves = sorted({t.wave for t in sched.tasks})
    return {w: scale * (1.0 + 0.7 * i) for i, w in enumerate(waves)}


@pytest.mark.parametrize("batch, claims", [(1, True), (3, True), (3, False), (20, True)])
def test_every_task_starts_as_soon_as_its_sm_and_its_barriers_allow(dims, batch, claims):
    """A list schedule without idle choice: each task starts at the later of its SM's previous end plus the
    gap and, for every barrier it waits on, that barrier's last signal plus the hop; every task (every
    claimed tile once) runs for its wave's duration."""
    sched = build_schedule(dims, StepShape(batch=batch, num_sms=5, attn_splits=2, attn_min_tiles=1,
                                           expert_claims=claims), TINY_I, TINY_DENSE_I)
    durations, hop, gap = durations_for(sched), 0.9, 0.2
    tl = timing.timeline(sched, durations, hop_us=hop, gap_us=gap)
    ran = sorted(i for lst in tl.sm_lists for i in lst)
    assert ran == list(range(len(sched.tasks)))  # every task once, claimed tiles included
    completion = {}
    for t in sched.tasks:
        if t.signal != NO_BARRIER:
            completion[t.signal] = max(completion.get(t.signal, 0.0), tl.end[t.index])
    for lst in tl.sm_lists:
        previous_end = None
        for i in lst:
            t = sched.tasks[i]
            assert tl.end[i] == pytest.approx(tl.start[i] + durations[t.wave])
            bound = max([0.0 if previous_end is None else previous_end + gap]
                        + [completion[b] + hop for b in t.waits])
            assert tl.start[i] == pytest.approx(bound)
            previous_end = tl.end[i]


def test_a_slower_wave_on_the_critical_path_lengthens_the_layer_and_an_unknown_wave_is_refused(dims):
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2, attn_min_tiles=1, **BARRIER_ROUTED),
                           TINY_I, TINY_DENSE_I)
    durations = durations_for(sched)
    moe = [i for i in range(1, dims.num_layers - 1) if not dims.dense[i]]
    base = timing.timeline(sched, durations).layer_period(sched, moe)
    slower = dict(durations, router_topk=durations["router_topk"] + 5.0)  # every expert task waits on it
    assert timing.timeline(sched, slower).layer_period(sched, moe) == pytest.approx(base + 5.0)
    with pytest.raises(ValueError, match="no duration"):
        timing.timeline(sched, {k: v for k, v in durations.items() if k != "o_proj"})


def test_a_delayed_signal_moves_only_the_waiters_not_the_sm_that_ran_the_task(dims):
    """signal_delay_us (the signal-delay probes): a wave's tasks end when they did, their SMs go on at once,
    and every task waiting on one of their barriers starts the delay later, as far as that barrier held it."""
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2, attn_min_tiles=1), TINY_I, TINY_DENSE_I)
    durations = durations_for(sched)
    base = timing.timeline(sched, durations)
    late = timing.timeline(sched, durations, signal_delay_us={"router_topk": 4.0})
    topk = [t for t in sched.tasks if t.wave == "router_topk"]
    first = topk[0]
    assert late.end[first.index] == pytest.approx(base.end[first.index])  # the task itself: unchanged
    waiters = [t for t in sched.tasks if first.signal in t.waits]
    assert waiters and all(late.start[t.index] >= late.end[first.index] + 4.0 + 1.0 - 1e-9 for t in waiters)
    moe = [i for i in range(1, dims.num_layers - 1) if not dims.dense[i]]
    # every expert task waits on the top-k: the layer moves by the whole delay, as a 4 us longer top-k would
    longer = timing.timeline(sched, dict(durations, router_topk=durations["router_topk"] + 4.0))
    assert late.layer_period(sched, moe) == pytest.approx(longer.layer_period(sched, moe))


def test_schedule_model_table_compares_schedules_on_a_profiles_durations(dims):
    from benchmarks import schedule_model

    config = json.loads((TINY_CONFIG / "config.json").read_text())
    sched = build_schedule(dims, StepShape(batch=2, num_sms=6, **BARRIER_ROUTED), TINY_I, TINY_DENSE_I)
    waves = [{"wave": w, "run_us": d} for w, d in durations_for(sched).items()]
    profile = {"results": [{"batch": 2, "schedule": "default", "waves": waves, "attn_splits": sched.shape.attn_splits,
                            "tiles": dataclasses.asdict(sched.tiles), "tasks": len(sched.tasks),
                            "distinct_experts": 3.2, "timeline": {"next_layer_us": 12.5}}]}
    schedules = ["default", "order=combine_before_experts"]
    rows = schedule_model.model_rows(config, profile, [2], schedules, num_sms=6, hop_us=1.0, gap_us=0.3)
    assert [r["schedule"] for r in rows] == schedules and rows[0]["vs_first"] == 0.0
    assert all(r["model_layer_us"] > 0 for r in rows)
    text = schedule_model.table(rows, schedules)
    assert f"| 2 | default | {rows[0]['model_layer_us']:.1f} | +0.0% | 12.5 |" in text
    # the fluid model times task sizes too (its costs from the same row, bytes from each task), and gives the step
    fl = schedule_model.model_rows(config, dict(profile, results=[dict(profile["results"][0], context=64)]), [2],
                                   ["default", "moe_up_cols=16"], num_sms=6, hop_us=0.7, gap_us=0.3, fluid_model=True)
    assert fl[0]["step_vs_first"] == 0.0 and fl[1]["model_step_us"] != fl[0]["model_step_us"]  # sizes count
    ftext = schedule_model.table(fl, ["default", "moe_up_cols=16"])
    assert f"| 2 | default | {fl[0]['model_step_us']:.0f} | +0.0% | {fl[0]['model_layer_us']:.1f} | - / 12.5 |" in ftext
    # with each schedule's modelled critical path: its parts sum to the modelled layer's period between the layers'
    # last writes, and the model's tasks read as whole runs (their marks span their bodies)
    pathed = schedule_model.model_rows(config, profile, [2], schedules, num_sms=6, hop_us=1.0, gap_us=0.3, paths=True)
    for r in pathed:
        p = r["critical"]
        assert sum(x.us for x in p.parts) == pytest.approx(p.period_us, abs=1e-6) and p.chains
        # (batch 2's default top-k polls the routers' posted scores: its edge is a "polled from" one, not a hop)
        assert {x.kind for x in p.parts} <= {"run", "queued"} | {x.kind for x in p.parts
                                                                 if x.kind.startswith(("hop", "polled from"))}
        assert any(x.kind == "run" for x in p.parts) and all(x.kind != "tail" for x in p.parts)
    for sized in ("moe_up_cols=16", "qkv_batch_split=2", "o_batch_split=2", "moe_combine_cols=16"):
        with pytest.raises(ValueError, match="changes task sizes"):
            schedule_model.model_rows(config, profile, [2], ["default", sized], num_sms=6, hop_us=1.0, gap_us=0.3)
    other = {"results": [dict(profile["results"][0], tasks=len(sched.tasks) + 1)]}  # another kernel's task list
    with pytest.raises(ValueError, match="batch 2: no row of the profile ran the tasks"):
        schedule_model.model_rows(config, other, [2], schedules, num_sms=6, hop_us=1.0, gap_us=0.3)
    with pytest.raises(ValueError, match="batch 4: no row of the profile ran the tasks"):
        schedule_model.model_rows(config, profile, [4], schedules, num_sms=6, hop_us=1.0, gap_us=0.3)
    # a row that measured today's default sizes under their names (a default changed since) stands for the
    # default; a row of the same tasks in another order does not
    named = dict(profile["results"][0], schedule=f"moe_up_cols={sched.tiles.moe_up_cols}")
    reordered = dict(profile["results"][0], schedule="order=combine_before_experts", timeline={"next_layer_us": 99.0})
    rows = schedule_model.model_rows(config, {"results": [reordered, named]}, [2], schedules, num_sms=6, hop_us=1.0,
                                     gap_us=0.3)
    assert rows[0]["measured_default_layer_us"] == 12.5
    with pytest.raises(ValueError, match="no row of the profile ran the tasks"):
        schedule_model.model_rows(config, {"results": [reordered]}, [2], schedules, num_sms=6, hop_us=1.0,
                                  gap_us=0.3)
    # longer attention splits build as many tasks and time differently: such a row is not the default's
    longer = dict(profile["results"][0], schedule="attn_min_tiles=16", timeline={"next_layer_us": 99.0})
    rows = schedule_model.model_rows(config, {"results": [longer, named]}, [2], schedules, num_sms=6, hop_us=1.0,
                                     gap_us=0.3)
    assert rows[0]["measured_default_layer_us"] == 12.5


@pytest.mark.parametrize("claims", [True, False])
def test_dead_slots_tasks_are_skipped_and_the_live_ones_still_run_as_soon_as_they_can(dims, claims):
    """With live_slots, a dead slot's expert tasks never run (a claiming place that draws a dead tile ends
    its wave on that SM) and take no time, the step still finishes, and every live expert tile runs."""
    from vllm_megakernel.megakernel.abi import ROUTED_OPS

    sched = build_schedule(dims, StepShape(batch=3, num_sms=5, attn_splits=2, attn_min_tiles=1,
                                           expert_claims=claims), TINY_I, TINY_DENSE_I)
    assert sched.num_slots > 2
    tl = timing.timeline(sched, durations_for(sched), live_slots=lambda layer: 2)
    ran = {i for lst in tl.sm_lists for i in lst}
    for t in sched.tasks:
        dead = t.op in ROUTED_OPS and t.fields["slot"] >= 2
        assert (t.index in ran) == (not dead), t.describe()
        assert (tl.start[t.index] == tl.start[t.index]) == (not dead)
    full = timing.timeline(sched, durations_for(sched))
    assert max(e for e in tl.end if e == e) <= max(full.end)

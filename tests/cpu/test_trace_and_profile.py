"""Host side of kernel profiling: the per-wave summary of a traced launch, the profile report's arithmetic,
random weights in vLLM's layout, and bulk-fill KV layouts (all on synthetic data; the GPU run is
benchmarks.kernel_profile)."""

import dataclasses
import statistics

import torch
import pytest

from conftest import REPO, TINY_CONFIG, committed_results, result_id

from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel import abi, trace
from vllm_megakernel.megakernel.abi import Op
from vllm_megakernel.megakernel.layout import moe_slots
from vllm_megakernel.megakernel.schedule import StepShape, build_schedule
from vllm_megakernel.paged_kv import PagedKVSim

TINY_I, TINY_DENSE_I = 32, 96

# The routing hop through the top-k's barrier, not its posted words (batch 2's default until session AR, PERF_LOG
# #194): these tests time that form's waits and hops.
BARRIER_ROUTED = dict(posted_routing=False)


@pytest.fixture(scope="module")
def dims():
    return ref.ModelDims.from_config(TINY_CONFIG)


def synthetic_records(sched, run_ns, wait_ns, gap_ns=100, physical=lambda block: 2 * block + 1):
    """Waves run one after another (in task order); every task of wave w waits wait_ns[w] then runs
    run_ns[w]; the tasks of one wave and layer run side by side on different SMs; block b runs on physical
    SM physical(b)."""
    rec = torch.zeros(len(sched.tasks), len(abi.TRACE_FIELDS), dtype=torch.int64)
    t = 1_000_000
    current, wave_start = None, t
    for task in sched.tasks:
        key = (task.layer, task.wave)
        if key != current:
            if current is not None:
                t = wave_start + wait_ns[current[1]] + run_ns[current[1]] + gap_ns
            current, wave_start = key, t
        start = wave_start + wait_ns[task.wave]
        end = start + run_ns[task.wave]
        rec[task.index] = torch.tensor([task.sm, wave_start, start, start + 100, start + 400, end - 200, end,
                                        physical(task.sm)])
    return rec


def test_layer_timeline_places_each_wave_after_the_layer_start(dims):
    """Synthetic waves run back to back: each wave's first run, median and last end, and the next layer's
    start come out as the sums of the runs, waits and gaps before them in the layer."""
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2, **BARRIER_ROUTED), TINY_I,
                           TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    run_ns = {w: 1000 * (i + 1) for i, w in enumerate(waves)}
    wait_ns = {w: 500 for w in waves}
    rec = synthetic_records(sched, run_ns, wait_ns)
    moe = [i for i in range(dims.num_layers - 1) if not dims.dense[i]]
    next_us, rows = trace.layer_timeline(sched, rec, moe)
    order = []
    for t in sched.tasks:
        if t.layer == moe[0] and t.wave not in order:
            order.append(t.wave)
    assert [r.wave for r in rows] == order
    at = 0.0
    for r in rows:
        assert r.first_run_us == pytest.approx(at / 1e3)
        assert r.median_end_us == r.last_end_us == pytest.approx((at + run_ns[r.wave]) / 1e3)
        assert r.tasks == sum(1 for t in sched.tasks if t.layer == moe[0] and t.wave == r.wave)
        at += run_ns[r.wave] + 500 + 100
    assert next_us == pytest.approx(at / 1e3)
    with pytest.raises(ValueError, match="following layer"):
        trace.layer_timeline(sched, rec, [dims.num_layers])  # the final norm: nothing follows it


def modelled_records(sched, durations, hop_us, tail_us=0.0):
    """Records of the schedule run by megakernel.timing with the gap between an SM's tasks equal to the signal
    hop (so "blocked on its inputs" means the same there and in critical_path: a signal after the SM was free).
    Times in ns; each task's compute end tail_us before its signal."""
    from vllm_megakernel.megakernel import timing

    timed = timing.timeline(sched, durations, hop_us=hop_us, gap_us=hop_us)
    rec = torch.zeros(len(sched.tasks), len(abi.TRACE_FIELDS), dtype=torch.int64)
    col = {n: abi.TRACE_FIELDS.index(n) for n in abi.TRACE_FIELDS}
    ns = lambda us: int(round(1_000_000 + 1000 * us))  # noqa: E731
    for sm, tasks in enumerate(timed.sm_lists):
        for i in tasks:
            start, end = timed.start[i], timed.end[i]
            rec[i, col["sm"]], rec[i, col["smid"]] = sm, sm
            rec[i, col["wait_start_ns"]] = ns(start - hop_us)
            rec[i, col["run_start_ns"]] = ns(start)
            rec[i, col["compute_end_ns"]] = ns(end - tail_us)
            rec[i, col["end_ns"]] = ns(end)
    return rec, timed


def test_a_polling_tasks_early_body_start_changes_no_wave_figure_and_the_path_goes_through_its_poll(dims):
    """Batch 1's top-k polls the routers' keys (posted scores, Task.polls_inputs): its body starts long before its
    inputs are in, and its inputs mark is where the poll ended. trace.task_fields takes that mark as its run start,
    so moving the body's start earlier (the inputs mark kept) changes no wave's run, wait or span in summarize, no
    hop in layer_hops (which leaves polling tasks out) and no part of the critical path, whose edge into the top-k
    is "polled from router"."""
    sched = build_schedule(dims, StepShape(batch=1, num_sms=6, attn_splits=2), TINY_I, TINY_DENSE_I)
    polling = [t.index for t in sched.tasks if t.polls_inputs]
    assert polling and all(sched.tasks[i].op == abi.Op.ROUTER_TOPK for i in polling)
    waves = sorted({t.wave for t in sched.tasks})
    durations = {w: 1.0 + 0.1 * i for i, w in enumerate(waves)}
    durations["router"] = 6.0  # the top-k's SM is free long before the routers' keys are in
    rec, _ = modelled_records(sched, durations, hop_us=0.5, tail_us=0.2)
    col = {n: abi.TRACE_FIELDS.index(n) for n in abi.TRACE_FIELDS}
    for i in range(len(sched.tasks)):  # every task marks its inputs 0.1 us into its run and its stages at its end
        if rec[i, col["end_ns"]]:
            rec[i, col["inputs_ns"]] = rec[i, col["run_start_ns"]] + 100
            rec[i, col["stages_ns"]] = rec[i, col["compute_end_ns"]]
    early = rec.clone()
    early[polling, col["run_start_ns"]] = early[polling, col["wait_start_ns"]]  # the body began with its wait
    layers = trace.middle_moe_layers(dims)
    assert trace.summarize(sched, early) == trace.summarize(sched, rec)
    assert trace.layer_hops(sched, early, layers) == trace.layer_hops(sched, rec, layers)
    assert all(h.waiter != "router_topk" for h in trace.layer_hops(sched, rec, layers))
    p, q = trace.critical_path(sched, early, layers), trace.critical_path(sched, rec, layers)
    assert p == q and any(r.kind == "polled from router" for r in p.parts), p
    assert sum(r.us for r in p.parts) == pytest.approx(p.period_us, abs=1e-6)


def test_critical_path_follows_what_held_each_task_back_to_the_previous_layers_last_write(dims):
    """A schedule run by the timing model (every task its wave's time, a signal starting a blocked task one hop
    later, an SM's next task one hop after its last): critical_path's parts of each layer sum to its period (the
    previous layer's last o / mlp write -> this one's); every hop it walks is the model's hop less the tail; a wave
    ten times longer than the rest is on every layer's path with at least one task's time; and a task whose SM was
    busy when its inputs came is reached through "queued", never through a hop."""
    sched = build_schedule(dims, StepShape(batch=1, num_sms=6, attn_splits=2), TINY_I, TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    layers = trace.middle_moe_layers(dims)
    for slow in ("mlp_up", "attn_partial", "o_proj"):
        durations = {w: 1.0 + 0.1 * i for i, w in enumerate(waves)}
        durations[slow] = 20.0
        rec, timed = modelled_records(sched, durations, hop_us=0.5, tail_us=0.2)
        p = trace.critical_path(sched, rec, layers)
        assert p.layers == len(layers) and sum(k for _, k in p.chains) == len(layers)
        assert sum(r.us for r in p.parts) == pytest.approx(p.period_us, abs=1e-6)
        assert p.period_us == pytest.approx(trace.layer_phases(sched, rec, layers).period_us)
        own = next(r for r in p.parts if (r.wave, r.kind) == (slow, "run"))
        assert own.layers == len(layers) and own.us >= 20.0 - 0.2 - 1e-6, p  # a task's run ends at its compute end
        assert all(slow in c for c, _ in p.chains)
        # each walked edge is whole: a hop is the model's (signal -> start), a tail the compute end -> signal, a
        # queue the gap after the SM's previous task plus that task's tail (its SM was free at its signal); batch 1's
        # top-k polls the routers' keys (posted scores), and this model starts it on their signals: a "polled from"
        # edge is a body's end -> the poller's start, the tail and the hop
        unit = {"tail": 0.2, "queued": 0.7}
        for r in p.parts:
            u = 0.5 if r.kind.startswith("hop from") else 0.7 if r.kind.startswith("polled from") else unit.get(r.kind)
            assert r.kind == "run" or u, r
            if u:
                per = r.us * len(layers) / r.layers
                assert per / u == pytest.approx(round(per / u), abs=1e-6) and per >= u - 1e-6, r
    text = trace.critical_markdown(p, "MoE layers x-y")
    assert f"period {p.period_us:.1f} us" in text and f"| {slow} | run | {own.us:.2f} |" in text
    # a run of one wave's tasks on one SM is written once with its count
    assert trace._chain_text(["o_proj", " > ", "qkv", " ~ ", "mlp_up", " ~ ", "mlp_up", " > ", "mlp_down"]) == \
        "o_proj > qkv ~ mlp_up x2 > mlp_down"


def test_critical_path_walks_a_hand_made_layer_through_hops_tails_and_a_posted_routing_poll():
    """One MoE layer by hand (us): the previous layer's MoE combine writes last at 11; the router runs from 11.7, the
    top-k from 13.7 and posts its words by 15; the up/gate task (posted routing: its barrier is the router's, its
    producer polls the top-k's words) runs from 15.5, the down task from 20.5, the MoE combine, the layer's last
    write, from 22.6 to 23. The walk goes back along every signal and the posted words, each part as long as it
    was, and ends at the previous layer's write; the O projection, done early, is not on it."""
    from types import SimpleNamespace

    from vllm_megakernel.megakernel.schedule import Task

    NB = abi.NO_BARRIER
    specs = [  # (op, layer, wave, waits, signal, load_wait, load_post, sm, run, done, end)
        (Op.O_PROJ, 1, "o_proj", (), 0, NB, -1, 5, 8.0, 10.0, 10.2),
        (Op.MOE_COMBINE, 1, "moe_combine", (), 1, NB, -1, 3, 9.0, 11.0, 11.2),
        (Op.ROUTER, 2, "router", (0, 1), 2, NB, -1, 0, 11.7, 13.0, 13.2),
        (Op.ROUTER_TOPK, 2, "router_topk", (2,), 3, NB, -1, 1, 13.7, 15.0, 15.2),
        (Op.MOE_UPGATE, 2, "mlp_up", (2,), 4, 2, 3, 2, 15.5, 20.0, 20.2),
        (Op.MOE_DOWN, 2, "mlp_down", (4,), 5, 2, 3, 2, 20.5, 22.0, 22.2),
        (Op.MOE_COMBINE, 2, "moe_combine", (5, 3), 6, NB, -1, 3, 22.6, 23.0, 23.2),
        (Op.O_PROJ, 2, "o_proj", (), 7, NB, -1, 4, 5.0, 8.0, 8.2),
        (Op.ROUTER, 3, "router", (6, 7), 8, NB, -1, 0, 23.7, 25.0, 25.2),
    ]
    tasks, rec = [], torch.zeros(len(specs), len(abi.TRACE_FIELDS), dtype=torch.int64)
    col = {n: abi.TRACE_FIELDS.index(n) for n in abi.TRACE_FIELDS}
    for i, (op, layer, wave, waits, signal, load_wait, load_post, sm, run, done, end) in enumerate(specs):
        tasks.append(Task(i, op, layer, wave, {}, waits, signal, (), (), load_wait=load_wait, sm=sm, load_post=load_post))
        for name, us in (("wait_start_ns", run - 0.3), ("run_start_ns", run), ("compute_end_ns", done), ("end_ns", end)):
            rec[i, col[name]] = int(round(1000 * us))
        rec[i, col["sm"]] = rec[i, col["smid"]] = sm
    p = trace.critical_path(SimpleNamespace(tasks=tasks), rec, [2])
    got = {(r.wave, r.kind): round(r.us, 6) for r in p.parts}
    assert got == {("moe_combine", "run"): 0.4, ("moe_combine", "hop from mlp_down"): 0.4, ("mlp_down", "tail"): 0.2,
                   ("mlp_down", "run"): 1.5, ("mlp_down", "hop from mlp_up"): 0.3, ("mlp_up", "tail"): 0.2,
                   ("mlp_up", "run"): 4.5, ("mlp_up", "posted from router_topk"): 0.5, ("router_topk", "run"): 1.3,
                   ("router_topk", "hop from router"): 0.5, ("router", "tail"): 0.2, ("router", "run"): 1.3,
                   ("router", "hop from moe_combine"): 0.5, ("moe_combine", "tail"): 0.2}
    assert p.period_us == pytest.approx(12.0) and sum(got.values()) == pytest.approx(12.0)
    assert p.chains == [("moe_combine > router > router_topk > mlp_up > mlp_down > moe_combine", 1)]
    # the top-k posts its words before its compute end: an up/gate task may start before that end, and the walk,
    # which only moves back in time, still counts each instant once
    rec[3, col["compute_end_ns"]], rec[3, col["end_ns"]] = 16000, 16200
    p = trace.critical_path(SimpleNamespace(tasks=tasks), rec, [2])
    assert sum(r.us for r in p.parts) == pytest.approx(12.0)
    # a task with no SM predecessor and no input that ran (the router, its waits taken away): the rest is its start
    import dataclasses as dc

    alone = tasks[:2] + [dc.replace(tasks[2], waits=())] + tasks[3:]
    p = trace.critical_path(SimpleNamespace(tasks=alone), rec, [2])
    assert {(r.wave, r.kind): round(r.us, 6) for r in p.parts}[("router", "start")] == 0.7
    assert sum(r.us for r in p.parts) == pytest.approx(12.0)
    with pytest.raises(ValueError, match="needs a layer before it"):
        trace.critical_path(SimpleNamespace(tasks=tasks), rec, [0])


def test_layer_phases_cut_each_moe_layer_at_its_router_inputs_and_first_expert_run(dims):
    """Synthetic waves back to back: a MoE layer's boundary runs from the previous layer's last o / mlp write to
    its first router task's inputs mark, its routing from there to its first up/gate task's run, the rest to its
    own last o / mlp write (a writer's compute end, not its signal); the three sum to the period, here the distance
    between layer starts. A router task without an inputs mark counts from its run; a layer without a router wave
    is refused."""
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2), TINY_I, TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    run_ns = {w: 1000 * (i + 1) for i, w in enumerate(waves)}
    wait_ns = {w: 300 + 50 * i for i, w in enumerate(waves)}
    rec = synthetic_records(sched, run_ns, wait_ns)
    # the same walk as synthetic_records: each (layer, wave) in task order starts after the one before it
    times, at, seen = {}, 1_000_000, []
    for t in sched.tasks:
        if (t.layer, t.wave) not in times:
            if seen:
                at += wait_ns[seen[-1][1]] + run_ns[seen[-1][1]] + 100
            seen.append((t.layer, t.wave))
            times[(t.layer, t.wave)] = (at + wait_ns[t.wave], at + wait_ns[t.wave] + run_ns[t.wave])
    layers = trace.middle_moe_layers(dims)

    def written(layer):  # synthetic_records stamps the compute end 200 ns before the end
        return max(times[(layer, w)][1] - 200 for w in trace.RESIDUAL_WRITER_WAVES if (layer, w) in times)

    for layer in layers:
        staged = times[(layer, "router")][0] + 100  # the synthetic inputs mark
        want = ((staged - written(layer - 1)) / 1e3, (times[(layer, "mlp_up")][0] - staged) / 1e3,
                (written(layer) - times[(layer, "mlp_up")][0]) / 1e3)
        p = trace.layer_phases(sched, rec, [layer])
        assert (p.boundary_us, p.routing_us, p.experts_us) == pytest.approx(want)
        assert p.period_us == pytest.approx(sum(want)) and p.layers == 1
    whole = trace.layer_phases(sched, rec, layers)
    next_us, _ = trace.layer_timeline(sched, rec, layers)
    assert whole.period_us == pytest.approx(next_us)  # identical layers: the writes are a period apart too
    unmarked = rec.clone()
    router = [t.index for t in sched.tasks if t.layer == layers[0] and t.wave == "router"]
    unmarked[router, abi.TRACE_FIELDS.index("inputs_ns")] = 0
    p = trace.layer_phases(sched, unmarked, layers[:1])
    assert p.boundary_us == pytest.approx(trace.layer_phases(sched, rec, layers[:1]).boundary_us - 0.1)
    dense = next(i for i in range(1, dims.num_layers) if dims.dense[i]) if any(dims.dense[1:]) else dims.num_layers
    with pytest.raises(ValueError, match="not a MoE layer"):
        trace.layer_phases(sched, rec, [dense])
    text = trace.phases_markdown(whole, "MoE layers x-y")
    assert f"| {whole.boundary_us:.1f} | {whole.routing_us:.1f} | {whole.experts_us:.1f} | {whole.period_us:.1f} |" in text


def test_task_bytes_share_a_waves_bytes_among_its_tasks_that_streamed(dims):
    """Each task of a wave and layer gets an equal share of the wave's bytes in that layer; a task without a
    stage phase (an empty attention split, say) gets none and the others share its part."""
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2), TINY_I, TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    rec = synthetic_records(sched, {w: 1000 for w in waves}, {w: 500 for w in waves})
    bytes_of = lambda wave, layer: None if wave == "router" else 1000.0 * (layer + 1) + len(wave)
    nb = trace.task_bytes(sched, rec, bytes_of)
    layer = next(i for i in range(dims.num_layers - 1) if not dims.dense[i])
    qkv = [t.index for t in sched.tasks if t.layer == layer and t.wave == "qkv"]
    assert len(qkv) > 1 and all(float(nb[i]) == pytest.approx(bytes_of("qkv", layer) / len(qkv)) for i in qkv)
    assert all(float(nb[t.index]) == 0.0 for t in sched.tasks if t.wave == "router")
    for wave in {t.wave for t in sched.tasks if t.layer == layer} - {"router"}:
        ix = [t.index for t in sched.tasks if t.layer == layer and t.wave == wave]
        assert float(nb[ix].sum()) == pytest.approx(bytes_of(wave, layer))
    rec[qkv[0], abi.TRACE_FIELDS.index("inputs_ns")] = 0  # no stage phase marked
    nb2 = trace.task_bytes(sched, rec, bytes_of)
    assert float(nb2[qkv[0]]) == 0.0
    assert float(nb2[qkv[1:]].sum()) == pytest.approx(bytes_of("qkv", layer))


def test_layer_activity_counts_waiting_and_running_sms_and_the_bytes_taken(dims):
    """Synthetic waves back to back (each task waits 500 ns, runs 1000 ns of which the consumers' part is 800,
    takes its bytes in the 300 ns of its stage phase): over the layer the stretches add up to every task's
    consumer time, every wait after the layer's first wave, and every byte of the layer; a stretch inside one
    wave's run holds that wave's SMs."""
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2, **BARRIER_ROUTED), TINY_I,
                           TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    rec = synthetic_records(sched, {w: 1000 for w in waves}, {w: 500 for w in waves})
    layer = next(i for i in range(dims.num_layers - 1) if not dims.dense[i])
    nb = trace.task_bytes(sched, rec, lambda wave, lay: 64.0 * (1 + waves.index(wave)))
    rows = trace.layer_activity(sched, rec, [layer], nb, bin_us=0.1)
    mine = [t for t in sched.tasks if t.layer == layer]
    order = list(dict.fromkeys(t.wave for t in mine))
    assert len(rows) == len(order) * 16 - 6  # waves 1.6 us apart, the last one's run ends 1.0 us after its wait
    assert sum(r.running for r in rows) * 100 == pytest.approx(800 * len(mine))
    first = sum(1 for t in mine if t.wave == order[0])
    assert sum(r.waiting for r in rows) * 100 == pytest.approx(500 * (len(mine) - first))
    assert sum(r.consumed_gbs for r in rows) * 100 == pytest.approx(sum(64.0 * (1 + waves.index(w)) for w in order))
    second = sum(1 for t in mine if t.wave == order[1])
    at = rows[(1600 + 600) // 100]  # the second wave runs 1.6-2.6 us after the layer started, takes bytes to 2.0
    assert at.running == pytest.approx(second) and at.waiting == 0 and at.consumed_gbs == 0
    wide = trace.layer_activity(sched, rec, [layer], nb)  # the default stretch: 1 us for a layer under 30 us
    assert [r.start_us for r in wide] == [float(i) for i in range(-(-(len(order) * 16 - 6) // 10))]
    assert sum(r.running for r in wide) * 1000 == pytest.approx(800 * len(mine))
    text = trace.activity_markdown(rows, "layer 1", bandwidth=1e12)
    assert text.startswith("what the SMs do over a layer (layer 1,") and f"| 0 | 0 | {first} |" in text
    with pytest.raises(ValueError, match="following layer"):
        trace.layer_activity(sched, rec, [dims.num_layers], nb)  # the final norm: nothing follows it


def _hops_by_brute_force(sched, rec, layers):
    """The hops of trace.layer_hops, the slow way: per task, scan every task for its barriers' signallers and for
    the task that ran on its SM just before it."""
    col = {n: rec[:, abi.TRACE_FIELDS.index(n)].tolist() for n in abi.TRACE_FIELDS}
    staged = [a > 0 and b >= a for a, b in zip(col["inputs_ns"], col["stages_ns"])]
    out = {}
    for t in sched.tasks:
        if t.layer not in layers or col["end_ns"][t.index] == 0 or (t.op == Op.ATTN_PARTIAL and not staged[t.index]):
            continue
        barriers = set(t.waits) | ({t.load_wait} if t.op in abi.ROUTED_OPS else set())
        ends = [(col["end_ns"][u.index], u.wave) for u in sched.tasks if u.signal in barriers and u.signal >= 0]
        if not ends:
            continue
        at, wave = max(ends)
        mine = col["run_start_ns"][t.index]
        order = lambda u: (col["run_start_ns"][u.index], u.index)  # noqa: E731 (synthetic waves start together)
        before = [u for u in sched.tasks if col["sm"][u.index] == col["sm"][t.index] and col["end_ns"][u.index]
                  and order(u) < order(t)]
        ready = col["compute_end_ns"][max(before, key=order).index] if before else 0
        if at > ready:
            out.setdefault((wave, t.wave), []).append((mine - at) / 1e3)
    return out


def test_layer_hops_time_each_blocked_wait_from_the_last_signal_to_the_run(dims):
    """Each task's wait on the barrier signalled last (its consumers' waits, and a routed expert task's
    producer's wait on the routing), counted when its SM was free before that signal: the same edges, counts
    and medians as a brute-force scan of synthetic waves; a task whose SM was still busy at the last signal, or
    an attention split that had no work (no stage phase marked: it does not wait), is left out."""
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2, **BARRIER_ROUTED), TINY_I,
                           TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    rec = synthetic_records(sched, {w: 900 + 70 * i for i, w in enumerate(waves)}, {w: 500 for w in waves})
    layers = [i for i in range(dims.num_layers - 1) if not dims.dense[i]]

    def check(rec):
        rows = {(r.signaller, r.waiter): r for r in trace.layer_hops(sched, rec, layers)}
        want = _hops_by_brute_force(sched, rec, layers)
        assert set(rows) == set(want) and ("router_topk", "mlp_up") in rows
        for k, v in want.items():
            assert rows[k].waits == len(v) and rows[k].hop_us == pytest.approx(statistics.median(v))
        return rows

    rows = check(rec)
    # an up/gate task's SM busy until after the top-k's signal: no longer blocked on it
    up = next(t for t in sched.tasks if t.wave == "mlp_up" and t.layer in layers)
    run = abi.TRACE_FIELDS.index("run_start_ns")
    before = max((t for t in sched.tasks if t.sm == up.sm and rec[t.index, run] < rec[up.index, run]),
                 key=lambda t: int(rec[t.index, run]))
    rec[before.index, abi.TRACE_FIELDS.index("compute_end_ns")] = rec[up.index, run] - 1
    assert check(rec)[("router_topk", "mlp_up")].waits == rows[("router_topk", "mlp_up")].waits - 1
    # an attention split that marked no stage phase had no work and did not wait
    split = next(t for t in sched.tasks if t.wave == "attn_partial" and t.layer in layers)
    edge = next(k for k in rows if k[1] == "attn_partial")
    rec[split.index, abi.TRACE_FIELDS.index("inputs_ns")] = 0
    assert check(rec)[edge].waits == rows[edge].waits - 1
    text = trace.hops_markdown(trace.layer_hops(sched, rec, layers), "layers 1-4")
    assert text.startswith("signal to run, per dependency edge (layers 1-4;") and "| router_topk | mlp_up |" in text


def test_signal_tails_group_each_tasks_signal_delay_by_the_wave_its_sm_ran_next(dims):
    """A task's tail is its end stamp (after the signaller's fence) less its compute end, grouped by its wave and
    the wave of the task its SM ran next (by run start): the same groups, counts and medians as a brute-force scan
    of synthetic waves; a task with nothing after it on its SM is left out, and a longer fence shows in its group."""
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2), TINY_I, TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    rec = synthetic_records(sched, {w: 900 + 70 * i for i, w in enumerate(waves)}, {w: 500 for w in waves})
    layers = [i for i in range(dims.num_layers - 1) if not dims.dense[i]]
    col = {n: rec[:, abi.TRACE_FIELDS.index(n)].tolist() for n in abi.TRACE_FIELDS}

    def brute_force():
        out = {}
        for t in sched.tasks:
            if t.layer not in layers or not col["end_ns"][t.index]:
                continue
            order = lambda u: (col["run_start_ns"][u.index], u.index)  # noqa: E731
            after = [u for u in sched.tasks if col["sm"][u.index] == col["sm"][t.index] and col["end_ns"][u.index]
                     and order(u) > order(t)]
            if after:
                nxt = min(after, key=order)
                out.setdefault((t.wave, nxt.wave), []).append((col["end_ns"][t.index] - col["compute_end_ns"][t.index]) / 1e3)
        return out

    def check():
        rows = {(r.wave, r.next_wave): r for r in trace.signal_tails(sched, rec, layers)}
        want = brute_force()
        assert set(rows) == set(want) and len(rows) > 3
        for k, v in want.items():
            assert rows[k].tasks == len(v) and rows[k].tail_us == pytest.approx(statistics.median(v))
        return rows

    rows = check()
    assert all(r.tail_us == pytest.approx(0.2) for r in rows.values())  # synthetic: compute end 200 ns before end
    # the up/gate tasks' fences made 3 us longer: their groups' medians move, the others' do not
    end = abi.TRACE_FIELDS.index("end_ns")
    for t in sched.tasks:
        if t.wave == "mlp_up":
            rec[t.index, end] += 3000
            col["end_ns"][t.index] += 3000
    after = check()
    assert {k for k in after if after[k].tail_us == pytest.approx(3.2)} == {k for k in after if k[0] == "mlp_up"} != set()
    text = trace.tails_markdown(trace.signal_tails(sched, rec, layers), "layers 1-4")
    assert text.startswith("signal tails, per wave and the wave its SM ran next (layers 1-4;") and "| mlp_up |" in text


def test_input_checks_time_the_waits_whose_inputs_were_all_signalled_long_before(dims):
    """A check counts where every barrier the task waits on had its last signal at least the lead before the task's
    wait began; its time is the wait's start to the run start, grouped by wave: the same groups, counts and medians as
    a brute-force scan of synthetic waves (whose signals end 100 ns before the next wave's waits start: every
    task with a waited barrier counts under a 50 ns lead, fewer under 200 ns, none under a second), and a longer
    look shows in its group."""
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2, **BARRIER_ROUTED), TINY_I,
                           TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    wait_ns = {w: 300 + 40 * i for i, w in enumerate(waves)}
    rec = synthetic_records(sched, {w: 900 for w in waves}, wait_ns)
    layers = [i for i in range(dims.num_layers - 1) if not dims.dense[i]]
    col = {n: rec[:, abi.TRACE_FIELDS.index(n)].tolist() for n in abi.TRACE_FIELDS}

    def brute_force(lead):
        last = {}
        for t in sched.tasks:
            if t.signal != abi.NO_BARRIER and col["end_ns"][t.index]:
                last[t.signal] = max(last.get(t.signal, 0), col["end_ns"][t.index])
        out = {}
        for t in sched.tasks:
            waits = [b for b in t.waits if b != abi.NO_BARRIER]
            if t.layer not in layers or not waits or any(b not in last for b in waits):
                continue
            if max(last[b] for b in waits) <= col["wait_start_ns"][t.index] - lead:
                out.setdefault(t.wave, []).append((col["run_start_ns"][t.index] - col["wait_start_ns"][t.index]) / 1e3)
        return out

    def check(lead):
        rows = {r.wave: r for r in trace.input_checks(sched, rec, layers, lead_ns=lead)}
        want = brute_force(lead)
        assert set(rows) == set(want)
        for w, v in want.items():
            assert rows[w].checks == len(v) and rows[w].check_us == pytest.approx(statistics.median(v))
        return rows

    rows = check(50)
    assert len(rows) > 3 and all(r.check_us == pytest.approx(wait_ns[w] / 1e3) for w, r in rows.items())
    assert sum(r.checks for r in check(200).values()) < sum(r.checks for r in rows.values())
    assert check(10**9) == {}
    # the down tasks' waits made 2 us longer (their run starts later): only their group moves
    run0 = abi.TRACE_FIELDS.index("run_start_ns")
    for t in sched.tasks:
        if t.wave == "mlp_down":
            rec[t.index, run0] += 2000
            col["run_start_ns"][t.index] += 2000
    after = check(50)
    assert after["mlp_down"].check_us == pytest.approx(wait_ns["mlp_down"] / 1e3 + 2)
    assert all(after[w] == rows[w] for w in rows if w != "mlp_down")
    text = trace.checks_markdown(trace.input_checks(sched, rec, layers, lead_ns=50), "layers 1-4", lead_ns=50)
    assert text.startswith("dependency checks that found their inputs done (layers 1-4; every waited barrier's last "
                           "signal at least 0.05 us before") and "| mlp_down |" in text


def test_every_layer_table_is_the_same_on_globaltimer_sized_stamps(dims):
    """A real trace's stamps are globaltimer nanoseconds (~1.76e18 on the H200 of session X), not the synthetic
    records' 1e6: a table that compares them with a Python float (promoted to float32) or keeps them in float64
    (256 ns steps) comes out wrong, as the activity table did on its first GPU run (all zeros). Shifting every
    stamp by such an offset changes none of the tables."""
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2), TINY_I, TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    rec = synthetic_records(sched, {w: 1000 + 37 * i for i, w in enumerate(waves)}, {w: 500 for w in waves})
    shifted = rec.clone()
    stamps = [abi.TRACE_FIELDS.index(n) for n in abi.TRACE_FIELDS if n.endswith("_ns")]
    shifted[:, stamps] += torch.where(rec[:, stamps] > 0, 1_764_830_000_000_000_001, 0)
    layers = [i for i in range(dims.num_layers - 1) if not dims.dense[i]]
    nb = trace.task_bytes(sched, rec, lambda wave, lay: 64.0 * (1 + waves.index(wave)))
    for table in (lambda r: trace.layer_activity(sched, r, layers, nb, bin_us=0.1),
                  lambda r: trace.layer_timeline(sched, r, layers), lambda r: trace.layer_ends(sched, r, layers),
                  lambda r: trace.layer_hops(sched, r, layers), lambda r: trace.signal_tails(sched, r, layers),
                  lambda r: trace.input_checks(sched, r, layers, lead_ns=50),
                  lambda r: trace.layer_phases(sched, r, layers), lambda r: trace.critical_path(sched, r, layers),
                  lambda r: trace.summarize(sched, r)):
        plain = table(rec)
        assert table(shifted) == plain
    assert any(r.running > 0 for r in trace.layer_activity(sched, shifted, layers, nb, bin_us=0.1))


def test_layer_ends_say_when_the_sms_finish_a_layer_and_with_which_wave(dims):
    """Per SM, its last task of the layer: every SM of the layer counts once, the last one ends with the
    layer's last wave, and one SM held up 7 us at the end of every layer moves only the last SM's end and
    that SM's row."""
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2), TINY_I, TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    rec = synthetic_records(sched, {w: 1000 * (i + 1) for i, w in enumerate(waves)}, {w: 500 for w in waves})
    moe = [i for i in range(dims.num_layers - 1) if not dims.dense[i]]
    next_us, timeline = trace.layer_timeline(sched, rec, moe)
    spread, rows = trace.layer_ends(sched, rec, moe)
    assert sum(r.sms for r in rows) == len({t.sm for t in sched.tasks if t.layer == moe[0]})
    assert spread["last"] == pytest.approx(timeline[-1].last_end_us) and spread["next_layer"] == pytest.approx(next_us)
    assert spread["first"] <= spread["half"] <= spread["p90"] <= spread["last"]
    last_wave = max(timeline, key=lambda r: r.last_end_us).wave
    assert any(r.wave == last_wave and r.end_us == pytest.approx(spread["last"]) for r in rows)
    late = rec.clone()
    for layer in moe:  # the first task of the layer's last wave ends 7 us later
        i = next(t.index for t in sched.tasks if t.layer == layer and t.wave == last_wave)
        late[i, abi.TRACE_FIELDS.index("end_ns")] += 7000
    spread2, rows2 = trace.layer_ends(sched, late, moe)
    assert spread2["last"] == pytest.approx(spread["last"] + 7)
    assert spread2["first"] == pytest.approx(spread["first"]) and spread2["half"] == pytest.approx(spread["half"])
    assert [(r.wave, r.sms) for r in rows2] == [(r.wave, r.sms) for r in rows]
    text = trace.ends_markdown(spread2, rows2, "MoE layers")
    assert f"the last at {spread2['last']:.1f}" in text and f"| {last_wave} |" in text
    with pytest.raises(ValueError, match="following layer"):
        trace.layer_ends(sched, rec, [dims.num_layers])


def test_wave_summary_recovers_run_wait_span_and_share(dims):
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2, **BARRIER_ROUTED), TINY_I,
                           TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    run_ns = {w: 1000 * (i + 1) for i, w in enumerate(waves)}
    wait_ns = {w: 500 for w in waves}
    step_us, rows = trace.summarize(sched, synthetic_records(sched, run_ns, wait_ns))
    by = {r.wave: r for r in rows}
    assert [r.wave for r in rows][:2] == ["qkv", "attn_partial"]  # step order
    for w in waves:
        assert by[w].run_us == pytest.approx(run_ns[w] / 1e3)
        assert by[w].wait_us == pytest.approx(0.5)
        assert by[w].tail_us == pytest.approx(0.2)
        assert (by[w].inputs_us, by[w].stages_us) == (pytest.approx(0.1), pytest.approx(0.3))
        assert by[w].span_us == pytest.approx(run_ns[w] / 1e3)  # tasks of one layer run side by side
    layers_of = {w: len({t.layer for t in sched.tasks if t.wave == w}) for w in waves}
    assert by["qkv"].layers == dims.num_layers and by["router"].layers == sum(not d for d in dims.dense)
    qkv_rows = (dims.num_heads + 2 * dims.num_kv_heads) * dims.head_dim
    assert by["qkv"].tasks_per_layer == qkv_rows // sched.tiles.qkv_rows
    assert by["qkv"].sms == 5
    assert sum(r.share for r in rows) < 1.0  # gaps and waits are not any wave's span
    busy = sum(layers_of[w] * run_ns[w] for w in waves) / 1e3
    assert sum(r.share for r in rows) * step_us == pytest.approx(busy)
    table = trace.markdown(step_us, rows)
    assert table.count("\n| ") == len(rows) + 1 and "step wall time" in table


def test_skipped_expert_tasks_leave_no_record_and_the_summary_counts_the_ones_that_ran(dims):
    """A dead slot's expert tasks are skipped by the producer (abi.py's routed descriptors) and leave no
    trace record: the summaries count and time only what ran. Any other task without a record means the
    launch did not finish."""
    sched = build_schedule(dims, StepShape(batch=2, num_sms=5, attn_splits=2), TINY_I, TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    rec = synthetic_records(sched, {w: 1000 for w in waves}, {w: 500 for w in waves})
    up = [t for t in sched.tasks if t.op == Op.MOE_UPGATE]
    per_layer = len(up) // len({t.layer for t in up})
    dead = [t.index for t in up if t.fields["slot"] >= 1]  # one live slot per layer
    rec[dead] = 0
    _, rows = trace.summarize(sched, rec)
    live_tiles = per_layer // moe_slots(dims, 2)
    mlp_up = {r.wave: r for r in rows}["mlp_up"]  # the dense layers' up tasks are in the wave too
    dense_up = sum(t.op == Op.DENSE_UPGATE for t in sched.tasks)
    moe_layers = len({t.layer for t in up})
    assert mlp_up.tasks_per_layer * mlp_up.layers == pytest.approx(dense_up + live_tiles * moe_layers)
    moe = [t.layer for t in sched.tasks if t.op == Op.ROUTER_TOPK][:1]
    _, timeline = trace.layer_timeline(sched, rec, moe)
    assert {r.wave: r.tasks for r in timeline}["mlp_up"] == live_tiles
    rec[next(t.index for t in sched.tasks if t.op == Op.O_PROJ)] = 0
    with pytest.raises(ValueError, match="O_PROJ.*did not finish"):
        trace.summarize(sched, rec)


def test_physical_sms_map_each_block_to_the_sm_its_records_name(dims):
    """physical_sms: block -> the %smid its tasks recorded; wave_physical_sms: the SMs of one wave of one
    layer; a block whose records name two SMs is refused; the report prints the map in runs."""
    from benchmarks import kernel_profile

    sched = build_schedule(dims, StepShape(batch=1, num_sms=6, attn_splits=2), TINY_I, TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    mapping = {0: 7, 1: 8, 2: 9, 3: 20, 4: 3, 5: 4}
    rec = synthetic_records(sched, {w: 1000 for w in waves}, {w: 100 for w in waves}, physical=mapping.get)
    assert trace.physical_sms(sched, rec) == [7, 8, 9, 20, 3, 4]
    moe = next(i for i in range(dims.num_layers) if not dims.dense[i])
    router_blocks = {t.sm for t in sched.tasks if t.layer == moe and t.wave == "router"}
    assert trace.wave_physical_sms(sched, rec, moe, "router") == sorted(mapping[b] for b in router_blocks)
    text = kernel_profile.physical_sms_markdown(trace.physical_sms(sched, rec),
                                                {"layer": moe, "router": [7], "router_topk": [8]})
    assert text.endswith("Blocks -> physical SMs: 0-2: 7-9, 3: 20, 4-5: 3-4")
    assert f"layer {moe}'s routing: router [7]; router_topk [8]" in text
    col = abi.TRACE_FIELDS.index("smid")
    rec[next(t.index for t in sched.tasks if t.sm == 2), col] = 11
    with pytest.raises(ValueError, match="block 2's tasks ran on physical SMs"):
        trace.physical_sms(sched, rec)


def test_an_unfinished_or_mismatched_trace_is_refused(dims):
    sched = build_schedule(dims, StepShape(batch=1, num_sms=3), TINY_I, TINY_DENSE_I)
    rec = torch.zeros(len(sched.tasks), len(abi.TRACE_FIELDS), dtype=torch.int64)
    with pytest.raises(ValueError, match="no trace record"):
        trace.summarize(sched, rec)
    with pytest.raises(ValueError, match="shape"):
        trace.summarize(sched, rec[:-1])


def test_profile_report_bandwidth_arithmetic(dims):
    import json

    from benchmarks import kernel_profile
    from benchmarks.sol import ModelBytes

    config = json.loads((TINY_CONFIG / "config.json").read_text())
    qkv = {"wave": "qkv", "ops": "QKV_ROPE", "layers": 6, "tasks_per_layer": 6, "sms": 5, "run_us": 1.0,
           "inputs_us": 0.1, "stages_us": 0.3, "tail_us": 0.2, "wait_us": 0.5, "span_us": 2.0, "share": 0.1}
    attn = dict(qkv, wave="attn_partial", ops="ATTN_PARTIAL", span_us=3.0)
    result = {"batch": 2, "context": 100, "attn_splits": 1, "tasks": 10, "step_us_median": 50.0,
              "step_us_min": 49.0, "traced_step_us": 51.0, "distinct_experts": 7.0, "waves": [qkv, attn]}
    nbytes = kernel_profile.kernel_bytes(config, 100, 2, 7.0)
    mb = ModelBytes.from_config(config)
    assert nbytes == mb.step_bytes([100, 100], 7.0) - config["vocab_size"] * config["hidden_size"] * 2
    text = kernel_profile.report([result], bandwidth=1e12, config=config)
    gbs = nbytes / 50e-6 / 1e9
    assert f"| 2 | 100 | default | 1 | 10 | 50 | 40000 | 7.0 | {nbytes / 1e9:.2f} | {gbs:.0f} |" in text
    # per wave: the bytes each layer must move and the bandwidth over the wave's span
    qkv_bytes = (8 + 2 * 2) * 16 * 64 * 2
    assert kernel_profile.wave_bytes(config, "qkv", 100, 2, 7.0) == qkv_bytes
    assert f"| {qkv_bytes / 1e6:.1f} | {qkv_bytes / 2e-6 / 1e9:.0f} |" in text
    # K/V: full layers read the whole history, sliding ones (window 8) the window, per request
    kv = [2 * 2 * (101 if not s else 8) * 2 * 2 * 16 for s in dims.sliding]
    assert kernel_profile.wave_bytes(config, "attn_partial", 100, 2, 7.0) == pytest.approx(sum(kv) / len(kv))
    assert "spans of every wave but attention, summed over the step: 0.01 ms" in text
    assert "when the SMs finish the layer" not in text  # a profile from before layer_ends
    ends = {"spread": {"first": 1.0, "half": 2.0, "p90": 3.0, "last": 4.5, "next_layer": 5.0},
            "waves": [{"wave": "o_proj", "sms": 3.0, "run_start_us": 1.5, "end_us": 2.5, "wait_us": 0.25}]}
    timeline = {"layers": "MoE layers 2-3", "next_layer_us": 5.0, "waves": []}
    text = kernel_profile.report([dict(result, timeline=timeline, ends=ends)], bandwidth=1e12, config=config)
    assert "half of them by 2.0, 90% by 3.0, the last at 4.5; the next layer's first task at 5.0" in text
    assert "| o_proj | 3.0 | 1.5 | 2.5 | 0.2 |" in text


def test_tasks_split_by_the_opcode_their_sm_ran_just_before():
    """Per SM in run-start order (not task order): an up/gate task right after another up/gate task counts
    as 'after its own opcode', the SM's first task and one after another opcode as 'after another'; a task
    that did not run counts nowhere. The report prints the split when a profile has it."""
    import json

    from benchmarks import kernel_profile

    up, down, o = int(Op.MOE_UPGATE), int(Op.MOE_DOWN), int(Op.O_PROJ)
    ops = [up, up, down, up, o, up]
    waves = ["mlp_up", "mlp_up", "mlp_down", "mlp_up", "o_proj", "mlp_up"]
    # (sm, run start, inputs, end) in us; task 1 runs before task 0 on SM 0; task 5 never ran
    rows = [(0, 10, 11, 14), (0, 0, 2, 9), (0, 15, 15.5, 18), (1, 0, 3, 10), (1, 11, 12, 13), (1, 0, 0, 0)]
    rec = torch.zeros(len(ops), len(abi.TRACE_FIELDS), dtype=torch.int64)
    for i, (sm, start, inputs, end) in enumerate(rows):
        if end:
            rec[i] = torch.tensor([sm, start * 1000 - 500, start * 1000, inputs * 1000, inputs * 1000 + 100,
                                   end * 1000 - 100, end * 1000, 40 + sm])
    ran = rec[:, abi.TRACE_FIELDS.index("end_ns")] > 0
    split = {r.wave: r for r in trace.after_previous(ops, waves, rec, ran)}
    assert list(split) == ["mlp_up", "mlp_down", "o_proj"]
    u = split["mlp_up"]
    assert (u.same, u.same_run_us, u.same_inputs_us) == (1, 4.0, 1.0)  # task 0, after task 1 on SM 0
    assert (u.other, u.other_run_us, u.other_inputs_us) == (2, 9.5, 2.5)  # tasks 1 and 3: each its SM's first
    assert split["mlp_down"].same == 0 and split["mlp_down"].same_run_us is None
    assert (split["mlp_down"].other, split["o_proj"].other) == (1, 1)
    config = json.loads((TINY_CONFIG / "config.json").read_text())
    result = {"batch": 1, "context": 100, "attn_splits": 1, "tasks": 6, "step_us_median": 50.0, "step_us_min": 49.0,
              "traced_step_us": 51.0, "distinct_experts": 7.0, "waves": []}
    assert "previous task" not in kernel_profile.report([result], bandwidth=1e12, config=config)
    stored = json.loads(json.dumps([dataclasses.asdict(r) for r in split.values()]))  # as profile.json keeps it
    text = kernel_profile.report([dict(result, after_previous=stored)], bandwidth=1e12, config=config)
    assert "| mlp_up | 1 | 4.0 | 1.0 | 2 | 9.5 | 2.5 |" in text and "| mlp_down | 0 | - | - | 1 | 3.0 | 0.5 |" in text
    assert "what the SMs do over a layer" not in text
    bins = [dataclasses.asdict(trace.ActivityBin(0.0, 3.0, 120.0, 2500.0)),
            dataclasses.asdict(trace.ActivityBin(2.0, 40.0, 92.0, 1000.0))]
    text = kernel_profile.report([dict(result, activity={"layers": "MoE layers 2-3", "bins": bins})], bandwidth=5e12,
                                 config=config)
    assert "what the SMs do over a layer (MoE layers 2-3," in text
    assert "| 0 | 3 | 120 | 2500 | 50% |" in text and "| 2 | 40 | 92 | 1000 | 20% |" in text
    # the signal tails, when the row has them (rows of runs before session AB do not)
    timeline = {"layers": "MoE layers 2-3", "next_layer_us": 40.0, "waves": []}
    assert "signal tails" not in kernel_profile.report([dict(result, timeline=timeline)], bandwidth=5e12, config=config)
    tails = json.loads(json.dumps([dataclasses.asdict(trace.Tail("mlp_up", "mlp_down", 12, 1.47, 2.21))]))
    text = kernel_profile.report([dict(result, timeline=timeline, tails=tails)], bandwidth=5e12, config=config)
    assert "signal tails, per wave and the wave its SM ran next (MoE layers 2-3;" in text
    assert "| mlp_up | mlp_down | 12 | 1.47 | 2.21 |" in text
    # what each layer's period waited on, when the row has it (rows of runs before session AH do not)
    assert "period waited on" not in text
    path = trace.CriticalPath(40.0, [trace.PathPart("o_proj", "queued", 1.25, 1.25 / 40, 2)], [("o_proj ~ o_proj", 2)], 2)
    stored = json.loads(json.dumps(dataclasses.asdict(path)))  # as profile.json keeps it: the chains as lists
    text = kernel_profile.report([dict(result, timeline=timeline, critical=stored)], bandwidth=5e12, config=config)
    assert trace.critical_markdown(path, "MoE layers 2-3").rstrip("\n") in text


def test_profile_rows_of_later_placements_say_which_placement_they_timed():
    """--placements: rows of the first placement (or of a run with one) read as before; later ones carry
    their placement in the summary table and their section heading."""
    import json

    from benchmarks import kernel_profile

    config = json.loads((TINY_CONFIG / "config.json").read_text())
    row = {"batch": 1, "context": 100, "schedule": "default", "attn_splits": 1, "tasks": 6, "step_us_median": 50.0,
           "step_us_min": 49.0, "traced_step_us": 51.0, "distinct_experts": 7.0, "waves": []}
    assert kernel_profile.row_label(row) == kernel_profile.row_label(dict(row, placement=0)) == "default"
    text = kernel_profile.report([dict(row, placement=0), dict(row, placement=2, step_us_median=60.0)],
                                 bandwidth=1e12, config=config)
    assert "| 1 | 100 | default | 1 | 6 | 50 |" in text and "| 1 | 100 | default @ placement 2 | 1 | 6 | 60 |" in text
    assert "### batch 1, context 100, schedule default @ placement 2 " in text


def test_profile_report_says_the_sm_clock_around_each_timing_when_nvidia_smi_could():
    """kernel_profile reads the SM clock and its clock-event reasons before and after each row's timed
    launches; the report lists them, and says nothing of clocks for profiles that have none."""
    import json

    from benchmarks import kernel_profile

    assert kernel_profile.parse_smi_clocks("1755, 0x0000000000000004\n") == {"sm_mhz": 1755,
                                                                             "reasons": "0x0000000000000004"}
    assert kernel_profile.parse_smi_clocks("[N/A], [N/A]") is None and kernel_profile.parse_smi_clocks("") is None
    config = json.loads((TINY_CONFIG / "config.json").read_text())
    row = {"batch": 1, "context": 100, "attn_splits": 1, "tasks": 10, "step_us_median": 50.0, "step_us_min": 49.0,
           "traced_step_us": 51.0, "distinct_experts": 7.0, "waves": []}
    throttled = dict(row, schedule="default", clocks=[{"sm_mhz": 1980, "reasons": "0x0"},
                                                      {"sm_mhz": 1755, "reasons": "0x4"}])
    unknown = dict(row, batch=8, schedule="norm=wave", clocks=[None, {"sm_mhz": 1980, "reasons": "0x0"}])
    text = kernel_profile.report([throttled, unknown], bandwidth=1e12, config=config)
    assert "batch 1 (default): 1980 / 1755 (0x4); batch 8 (norm=wave): ? / 1980 (0x0)" in text
    for rows in ([row], [dict(row, clocks=[None, None])]):
        assert "SM clock" not in kernel_profile.report(rows, bandwidth=1e12, config=config)


def test_random_weights_have_the_checkpoint_layout_and_decode(dims, tiny_checkpoint):
    ckpt = ref.Weights.from_checkpoint(tiny_checkpoint, dims, dtype=torch.float32)
    rnd = ref.Weights.random(dims, *ckpt.intermediates(), device="cpu", dtype=torch.float32, seed=3)
    assert rnd.embed.shape == ckpt.embed.shape and rnd.final_norm.shape == ckpt.final_norm.shape
    for a, b in zip(rnd.layers, ckpt.layers):
        for f in ("norm", "qkv", "o", "gate_up", "down", "router", "w13", "w2"):
            x, y = getattr(a, f), getattr(b, f)
            assert (x is None) == (y is None) and (x is None or x.shape == y.shape), f
    assert rnd.layers[1].w13.std().item() == pytest.approx(0.02, rel=0.05)
    sim = PagedKVSim(dims, num_requests=2, max_len=8, block_size=4)
    out = ref.decode_step(dims, rnd, sim.step([3, 4]))
    assert torch.isfinite(out).all()


def test_layout_only_history_matches_the_filled_one_and_leaves_the_cache_alone(dims):
    lengths = [dims.sliding_window + 5, 3]
    a = PagedKVSim(dims, num_requests=2, max_len=40, block_size=4, seed=1)
    b = PagedKVSim(dims, num_requests=2, max_len=40, block_size=4, seed=1)
    a.fill_history(lengths, generator=torch.Generator().manual_seed(0))
    b.fill_history(lengths, values=False)
    for ta, tb in zip(a.tables, b.tables):
        assert torch.equal(ta, tb)
    assert all(torch.isnan(c).all() for c in b.kv_caches)
    assert not all(torch.isnan(c).all() for c in a.kv_caches)


# Profiles in the current report format (v1's, h200-2026-11-30-kernel-profile, predates --schedules).
PROFILES = committed_results("profile.json", lambda text: '"schedule"' in text)


@pytest.mark.parametrize("profile", PROFILES, ids=[result_id(p) for p in PROFILES])
def test_committed_kernel_profile_reports_are_what_the_tool_writes_from_their_figures(profile):
    import json

    from benchmarks import kernel_profile

    data = json.loads(profile.read_text())
    text = kernel_profile.report(data["results"], data["bandwidth_bytes_per_s"], data["config"])
    assert (profile.parent / "report.md").read_text() == text


def test_attention_bench_counts_visible_kv_bytes_and_flags_disagreeing_outputs():
    """benchmarks.attention_bench: a sliding layer reads at most its window (the new token included), a full
    layer the whole history plus the new token; the table gives both sides' share of copy bandwidth and
    says so plainly when the two outputs disagree."""
    from benchmarks import attention_bench as ab

    assert ab.kv_bytes(1, 8192, 4096, 4, 128) == 4096 * 2 * 4 * 128 * 2
    assert ab.kv_bytes(2, 1000, 4096, 4, 128) == 2 * 1001 * 2 * 4 * 128 * 2
    assert ab.kv_bytes(1, 8192, None, 4, 128) == 8193 * 2 * 4 * 128 * 2
    dims = ab.attention_dims(ref.ModelDims.from_config(REPO / "configs" / "north-mini-code"))
    assert dims.num_layers == 2 and dims.sliding == (True, False) and dims.dense == (False, False)
    case = {"batch": 1, "context": 8192, "layer": "full", "window": None, "attn_splits": 128, "tasks": 160,
            "kv_bytes": 16.8e6, "fa3_us": 5.0, "megakernel_us": 10.0, "megakernel_span_us": 7.0, "min_cosine": 0.9999}
    bad = dict(case, layer="sliding", min_cosine=0.5)
    text = ab.table({"bandwidth_bytes_per_s": 4.2e12, "reps": 10, "iters": 20, "cases": [case, bad]})
    assert "| 1 | 8192 | full | 128 | 16.8 | 5.0 | 80% | 10.0 | 40% | 7.0 | 2.00x | 0.99990 | - | - | - |" in text
    assert "DISAGREE 0.5000" in text
    traced = dict(case, partial_task_us=3.0, busiest_sm_partial_us=6.0, combine_task_us=1.5)
    assert "| 2.00x | 0.99990 | 3.0 | 6.0 | 1.5 |" in ab.table({"bandwidth_bytes_per_s": 4.2e12, "reps": 10,
                                                           "iters": 20, "cases": [traced]})


def test_attention_breakdown_finds_the_sm_that_ran_two_partial_tasks():
    """attention_bench's task_breakdown over a traced launch: with more partial tasks than SMs one SM runs two
    in a row, and its sum, not the median task, is what the wave waits for; a split with no keys (it returns
    before marking its inputs) counts in neither."""
    from benchmarks import attention_bench as ab
    from vllm_megakernel.megakernel import abi
    from vllm_megakernel.megakernel.schedule import StepShape, attention_schedule

    dims = ab.attention_dims(ref.ModelDims.from_config(REPO / "configs" / "north-mini-code"))
    sched = attention_schedule(dims, StepShape(batch=8, num_sms=4, attn_splits=1), 1, 768, 0)
    col = {name: i for i, name in enumerate(abi.TRACE_FIELDS)}
    rec = torch.zeros(len(sched.tasks), len(abi.TRACE_FIELDS), dtype=torch.int64)
    partials = [t for t in sched.tasks if t.wave == "attn_partial"]
    combines = [t for t in sched.tasks if t.wave == "attn_combine"]
    assert len(partials) == 8 and combines
    for i, t in enumerate(partials):  # SM 0 runs two 5 us tasks, the rest one of 4 us; the last has no keys
        sm = 0 if i < 2 else i - 1
        start = 10_000 if i == 1 else 0
        rec[t.index, col["sm"]], rec[t.index, col["run_start_ns"]] = sm, start
        rec[t.index, col["end_ns"]] = start + (5_000 if sm == 0 else 4_000)
        rec[t.index, col["inputs_ns"]] = start + 500
    empty = partials[-1].index  # returns at once, unmarked, on the busiest SM
    rec[empty, col["sm"]], rec[empty, col["end_ns"]], rec[empty, col["inputs_ns"]] = 0, 20_300, 0
    rec[empty, col["run_start_ns"]] = 20_000
    for t in combines:
        rec[t.index, col["run_start_ns"]], rec[t.index, col["end_ns"]] = 20_000, 21_500
    got = ab.task_breakdown(sched, rec)
    assert got == {"partial_task_us": 4.0, "busiest_sm_partial_us": 10.0, "combine_task_us": 1.5}


def test_candidate_kernel_patches_still_apply_to_the_tree():
    """benchmarks/candidates holds kernel variants written but not yet measured: each still applies to the
    sources (a change that breaks one updates or drops it)."""
    import shutil
    import subprocess

    patches = sorted((REPO / "benchmarks" / "candidates").rglob("*.patch"))  # the probes in subfolders too
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    for patch in patches:
        done = subprocess.run(["git", "apply", "--check", str(patch)], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, f"{patch.name} no longer applies: {done.stderr}"


def test_kernel_profile_parses_every_schedule_choice_it_names():
    """--schedules takes StepShape's choices by name (a typo fails before minutes of GPU work)."""
    from benchmarks.kernel_profile import parse_schedule
    from vllm_megakernel.megakernel.schedule import StepShape

    shape = parse_schedule("order=combine_before_experts,o_within_down=0.4,expert_claims=1,moe_down_rows=64")
    assert shape == {"order": "combine_before_experts", "o_within_down": 0.4, "expert_claims": True,
                     "tiles": (("moe_down_rows", 64),)}
    assert StepShape(batch=8, num_sms=132, **shape).o_within_down == 0.4
    with pytest.raises(ValueError, match="unknown schedule choice"):
        parse_schedule("o_within=0.4")


def test_kernel_profile_skips_a_batch_whose_kv_would_not_fit_and_says_why(dims):
    """PagedKVSim.cache_bytes is what its caches take (every layer the whole pool), and kernel_profile leaves out
    a batch whose K/V stand-in would not fit the free memory with its margin, naming the need and the room:
    64 rows of 8K on the full model need 49 GiB, more than an 80 GB H100 has beside the weights."""
    from benchmarks.kernel_profile import KV_FIT_MARGIN, kv_does_not_fit

    for requests, max_len, dtype in ((3, 70, torch.float32), (1, 16, torch.bfloat16)):
        sim = PagedKVSim(dims, num_requests=requests, max_len=max_len, block_size=16, dtype=dtype)
        assert PagedKVSim.cache_bytes(dims, requests, max_len, 16, dtype) == sum(c.nbytes for c in sim.kv_caches)
    full = ref.ModelDims.from_config(REPO / "configs" / "north-mini-code")
    need = PagedKVSim.cache_bytes(full, 64, 8193, 16, torch.bfloat16)
    assert 48 << 30 < need < 50 << 30
    why = kv_does_not_fit(full, 64, 8192, 17 << 30)
    assert why.startswith("batch 64, context 8192: not run") and "49.1 GiB" in why and "17.0 GiB were free" in why
    assert kv_does_not_fit(full, 8, 8192, 17 << 30) is None
    assert kv_does_not_fit(full, 64, 8192, need + KV_FIT_MARGIN) is None
    assert kv_does_not_fit(full, 64, 8192, need + KV_FIT_MARGIN - 1) is not None


def test_step_placements_tells_a_placement_effect_from_round_noise():
    """benchmarks.step_placements: each placement's median over its rounds, the spread between placements
    and the largest spread within one; the verdict names a placement effect only when the placements differ
    by more than twice their own rounds do."""
    from benchmarks.step_placements import placement_spread, report

    fast, slow = [2300.0, 2310.0, 2305.0], [2600.0, 2590.0, 2610.0]
    s = placement_spread([fast, slow, fast])
    assert s["per_step_us"] == [2305.0, 2600.0, 2305.0]
    assert abs(s["between"] - 295.0 / statistics.mean([2305.0, 2600.0, 2305.0])) < 1e-12
    assert abs(s["within"] - 20.0 / 2600.0) < 1e-12
    assert "differ by more than their own rounds do" in report([fast, slow, fast], 1, 8192)
    noisy = [[2300.0, 2600.0, 2450.0], [2320.0, 2580.0, 2400.0]]
    assert "no more than twice" in report(noisy, 1, 8192)
    with pytest.raises(ValueError):
        placement_spread([[2300.0], []])


def test_traced_launch_reports_times_from_the_time_fields_and_where_the_blocks_ran(dims, monkeypatch):
    """kernel_profile.traced_launch on the CPU with the launch stood in for (the trace filled with synthetic
    records): the per-task times are the six time fields after the step's first wait (the physical SM is not
    one of them), and the block -> physical SM map and the routing's physical SMs come from the records."""
    from benchmarks import kernel_profile
    from vllm_megakernel.megakernel import runtime

    weights = ref.Weights.random(dims, TINY_I, TINY_DENSE_I, "cpu")
    sim = PagedKVSim(dims, num_requests=1, max_len=10, block_size=4, dtype=torch.bfloat16, seed=1)
    sim.fill_history([5], generator=torch.Generator().manual_seed(1))
    inp = sim.step([3])
    sched = build_schedule(dims, StepShape(batch=1, num_sms=6, attn_min_tiles=1), TINY_I, TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    rec = synthetic_records(sched, {w: 1000 for w in waves}, {w: 100 for w in waves}, physical=lambda b: 40 - b)
    build = runtime.build_step

    def traced_step(*args, **kwargs):
        step = build(*args, **kwargs)
        step.trace.copy_(rec)
        return step

    monkeypatch.setattr(runtime, "build_step", traced_step)
    monkeypatch.setattr(runtime, "launch", lambda step, ext=None: None)
    monkeypatch.setattr(runtime, "check", lambda step: None)
    out = kernel_profile.traced_launch(dims, weights, inp, sched, ext=object())
    assert out["physical_sms"] == [40, 39, 38, 37, 36, 35]
    moe = trace.middle_moe_layers(dims)[0]
    assert out["routing_physical_sms"] == {"layer": moe, **{w: sorted({40 - t.sm for t in sched.tasks
                                                                       if t.layer == moe and t.wave == w})
                                                           for w in ("router", "router_topk")}}
    times = out["task_trace"]["times_ns"]
    assert times.shape == (len(sched.tasks), 6) and out["task_trace"]["time_fields"][0] == "wait_start_ns"
    first = int(rec[:, abi.TRACE_FIELDS.index("wait_start_ns")].min())
    end = abi.TRACE_FIELDS.index("end_ns")
    assert torch.equal(times[:, 5], (rec[:, end] - first).to(torch.int32))
    assert torch.equal(out["task_trace"]["smid"], rec[:, abi.TRACE_FIELDS.index("smid")].to(torch.int16))
    middle = trace.middle_moe_layers(dims)
    assert out["activity"]["layers"] == f"MoE layers {middle[0]}-{middle[-1]}"
    # the layer's weight and K/V bytes, each task's share taken in its stage phase (these synthetic waves run
    # every task of a wave side by side, whatever the SM count)
    bins = out["activity"]["bins"]
    assert bins and max(b["consumed_gbs"] for b in bins) > 0 and max(b["running"] for b in bins) > 0
    assert all(b["running"] >= 0 and b["waiting"] >= 0 for b in bins)
    assert out["hops"] == [dataclasses.asdict(h) for h in trace.layer_hops(sched, rec, middle)] and out["hops"]
    assert out["tails"] == [dataclasses.asdict(x) for x in trace.signal_tails(sched, rec, middle)] and out["tails"]
    assert out["checks"] == [dataclasses.asdict(x) for x in trace.input_checks(sched, rec, middle)]
    assert out["phases"] == dataclasses.asdict(trace.layer_phases(sched, rec, middle))
    assert out["critical"] == dataclasses.asdict(trace.critical_path(sched, rec, middle)) and out["critical"]["parts"]



def test_reread_gives_the_activity_table_of_the_run_from_its_saved_records(dims, monkeypatch, tmp_path):
    """kernel_profile --reread on a run's profile.json and traces.pt (what --save-traces writes) rebuilds the
    schedule, turns the saved times back into records (the same records, up to the step's first wait) and gives
    the activity table the run's own report had; a trace whose tasks are not the rebuilt schedule's is refused, and
    so is a profile with more than one row past the traces (one is a run stopped between a row's two saves)."""
    import json

    from benchmarks import kernel_profile
    from conftest import TINY_CONFIG as config_dir

    sched = build_schedule(dims, StepShape(batch=1, num_sms=6, attn_min_tiles=1), TINY_I, TINY_DENSE_I)
    waves = sorted({t.wave for t in sched.tasks})
    rec = synthetic_records(sched, {w: 900 + 50 * i for i, w in enumerate(waves)}, {w: 100 for w in waves})
    rec[:, 1:7] += torch.where(rec[:, 1:7] > 0, 1_764_830_000_000_000_000, 0)  # globaltimer-sized stamps
    tt = kernel_profile.task_trace_of(sched, rec)
    back = kernel_profile.records_of(tt)
    stamps = [abi.TRACE_FIELDS.index(n) for n in abi.TRACE_FIELDS if n.endswith("_ns")]
    first = int(rec[:, abi.TRACE_FIELDS.index("wait_start_ns")].min())
    assert torch.equal(back[:, stamps], rec[:, stamps] - first + kernel_profile.REREAD_T0_NS)
    assert torch.equal(back[:, [0, 7]], rec[:, [0, 7]])
    config = json.loads((config_dir / "config.json").read_text())
    moe = {i: 8.0 for i in range(dims.num_layers) if not dims.dense[i]}
    bins = kernel_profile.layer_activity_of(dims, TINY_I, TINY_DENSE_I, sched, rec, [4097], moe)
    row = {"batch": 1, "context": 4096, "schedule": "attn_min_tiles=1", "distinct_experts": 8.0}
    (tmp_path / "profile.json").write_text(json.dumps({"bandwidth_bytes_per_s": 1e12, "results": [row]}))
    torch.save([tt], tmp_path / "traces.pt")
    text = kernel_profile.reread(tmp_path, config)
    layers = trace.middle_moe_layers(dims)
    assert trace.activity_markdown(bins, f"MoE layers {layers[0]}-{layers[-1]}", 1e12) in text
    assert trace.hops_markdown(trace.layer_hops(sched, rec, layers), f"MoE layers {layers[0]}-{layers[-1]}") in text
    assert trace.tails_markdown(trace.signal_tails(sched, rec, layers), f"MoE layers {layers[0]}-{layers[-1]}") in text
    assert trace.checks_markdown(trace.input_checks(sched, rec, layers), f"MoE layers {layers[0]}-{layers[-1]}") in text
    assert trace.phases_markdown(trace.layer_phases(sched, rec, layers), f"MoE layers {layers[0]}-{layers[-1]}") in text
    assert trace.critical_markdown(trace.critical_path(sched, rec, layers), f"MoE layers {layers[0]}-{layers[-1]}") in text
    assert max(b.consumed_gbs for b in bins) > 0
    # a run stopped between a row's two saves: profile.json has that row, traces.pt not; the rows before it are read
    (tmp_path / "profile.json").write_text(json.dumps({"bandwidth_bytes_per_s": 1e12, "results": [row, row]}))
    stopped = kernel_profile.reread(tmp_path, config)
    assert "stopped between the two saves" in stopped and text in stopped
    (tmp_path / "profile.json").write_text(json.dumps({"bandwidth_bytes_per_s": 1e12, "results": [row, row, row]}))
    with pytest.raises(ValueError, match="1 traces for 3 rows"):
        kernel_profile.reread(tmp_path, config)
    (tmp_path / "profile.json").write_text(json.dumps({"bandwidth_bytes_per_s": 1e12,
                                                       "results": [{**row, "batch": 2}]}))
    with pytest.raises(ValueError, match="not the traced one"):
        kernel_profile.reread(tmp_path, config)

"""Where a megakernel step spends its time, from the per-task records of a traced launch.

``runtime.build_step(..., trace=True)`` gives the kernel a buffer with one record per task (abi.TRACE_FIELDS:
SM, wait start, run start, end; globaltimer ns). This module turns it into a per-wave table:

- tasks per layer and the SMs they landed on;
- run time: mean body time of one task (run start to end), the work the wave does per task, and its
  phases: until the activation rows were staged (inputs), from then until the last weight or K/V stage
  was consumed (stages), and the fence and barrier after the body (tail, its outputs becoming visible);
  ATTN_COMBINE marks its first head: inputs until the splits' weights are known, stages until the partial
  outputs are summed; ROUTER_TOPK: inputs until the first row's scores are loaded (0 with uniform routing),
  stages until every row's experts are chosen (the expert work list is the rest of the run);
- wait time: mean time a task's leader spent on its input barriers, i.e. waiting for earlier waves;
- span: per layer, first run start to last end of the wave's tasks, averaged over layers -- the wall time
  the wave occupies on the critical path when waves do not overlap;
- share: the wave's summed spans over the whole step's wall time (first wait start to last end).

``layer_timeline`` shows the same records as one layer's critical path: when each wave's first task ran,
when its tasks ended (median and last), relative to the layer's first task, and when the next layer began;
medians over the layers asked for. ``layer_ends`` shows the layer's end from the SMs' side: when the SMs
finished their last task of the layer (the first, half, 90% and the last of them) and which wave those
last tasks belonged to, so a layer that ends late says whether a few SMs hold it up, and with what.
``layer_activity`` cuts the layer into short stretches and says, for each, how many SMs were waiting on input
barriers, how many were running a task, and how fast the consumers took in weight and K/V bytes (each task's
share of its wave's bytes, spread over its stage phase): the stretches where few SMs stream are where HBM idles.
``layer_hops`` says how long a signal takes to start the task blocked on it, per pair of waves.
``layer_phases`` cuts each MoE layer's period at its routing chain, from events that do not move with the
schedule's choices (the timeline's reference, the layer's first task, is often an attention split that starts
whenever its SM reaches it): the previous layer's last write of o or mlp, this layer's first router task with its
activation rows staged, its first expert task's run, its own last write of o or mlp. A change that shortens the
routing chain and not the period shows up as time moved into the phase after it. ``critical_path`` walks each
layer back from its last o / mlp write, at every task to what held its start (the last signal it waited for, or
the SM's previous task), and says where the period went: tasks' phases, signal hops and tails, queues.

Plain torch on the host; the CPU tests feed it synthetic records.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import torch

from vllm_megakernel.megakernel import abi
from vllm_megakernel.megakernel.schedule import Schedule


@dataclasses.dataclass
class WaveTime:
    wave: str
    ops: str
    layers: int
    tasks_per_layer: float
    sms: int
    run_us: float  # mean task body time
    inputs_us: float  # of which until the activation rows were staged (ops that stage them)
    stages_us: float  # of which from then until the last weight / K/V stage was consumed
    tail_us: float  # of which after the body returned: fence and named barrier before the signal
    wait_us: float  # mean time on input barriers
    span_us: float  # mean per-layer span
    share: float  # summed spans / step time


def record_fields(records: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The records on the CPU as int64, and each abi.TRACE_FIELDS column of them by name."""
    rec = records.detach().to("cpu", torch.int64)
    return rec, {name: rec[:, i] for i, name in enumerate(abi.TRACE_FIELDS)}


def task_fields(schedule: Schedule, records: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """record_fields, with the run start of a task that polls its inputs' own words (``Task.polls_inputs``: the
    top-k under posted scores) moved to its inputs mark. Such a task's body begins before its inputs are in and the
    poll is its wait: from where the poll ended its wait, run, span and place on a critical path read as those of a
    task that waited on its barriers do (the kernel's run start is after the waits). Under uniform routing the
    kernel's top-k waits on its barrier instead (it reads no scores), which the schedule does not record: there its
    inputs mark comes right at its run start, so nothing moves, and only the hop table (which leaves it out) and the
    critical path's name for its edge ("polled from") misread it."""
    rec, f = record_fields(records)
    polled = [t.index for t in schedule.tasks if t.polls_inputs]
    if not polled:
        return rec, f
    rec = rec.clone()  # record_fields may hand back the caller's own tensor
    col = abi.TRACE_FIELDS.index("run_start_ns")
    idx = torch.tensor(polled)
    marks = rec[idx, abi.TRACE_FIELDS.index("inputs_ns")]
    rec[idx, col] = torch.where(marks > 0, marks, rec[idx, col])
    return rec, {name: rec[:, i] for i, name in enumerate(abi.TRACE_FIELDS)}


def ran_tasks(schedule: Schedule, records: torch.Tensor) -> torch.Tensor:
    """bool [num_tasks]: the tasks that ran and left a record. Only an expert task may have none (a dead
    slot's, which the producer skips: abi.py's routed descriptors); any other missing record means the
    launch did not finish (or was not traced)."""
    rec = records.detach().to("cpu", torch.int64)
    if rec.shape != (len(schedule.tasks), len(abi.TRACE_FIELDS)):
        raise ValueError(f"trace has shape {tuple(rec.shape)}, schedule has {len(schedule.tasks)} tasks")
    ran = rec[:, abi.TRACE_FIELDS.index("end_ns")] > 0
    ran_list = ran.tolist()  # a Python list: indexing a tensor per task costs seconds at batch 64's 385K tasks
    missing = [t.index for t in schedule.tasks if not ran_list[t.index] and t.op not in abi.ROUTED_OPS]
    if missing:
        raise ValueError(f"{len(missing)} tasks have no trace record (first: "
                         f"{schedule.tasks[missing[0]].describe()}): the launch did not finish (or was not traced)")
    return ran


def physical_sms(schedule: Schedule, records: torch.Tensor) -> list[int]:
    """Per block (the schedule's SM), the physical SM (%smid) it ran on; -1 for a block none of whose tasks
    left a record. A block runs on one SM for the whole launch, so its records must agree."""
    rec, col = record_fields(records)
    ran = ran_tasks(schedule, rec)
    out = [-1] * len(schedule.sm_tasks)
    for block, smid in zip(col["sm"][ran].tolist(), col["smid"][ran].tolist()):
        if out[block] not in (-1, smid):
            raise ValueError(f"block {block}'s tasks ran on physical SMs {out[block]} and {smid}")
        out[block] = smid
    return out


def wave_physical_sms(schedule: Schedule, records: torch.Tensor, layer: int, wave: str) -> list[int]:
    """The physical SMs (ascending, distinct) that ran ``wave``'s tasks of ``layer``."""
    rec, col = record_fields(records)
    ran = ran_tasks(schedule, rec)
    return sorted({int(col["smid"][t.index]) for t in schedule.tasks
                   if t.layer == layer and t.wave == wave and ran[t.index]})


def summarize(schedule: Schedule, records: torch.Tensor) -> tuple[float, list[WaveTime]]:
    """(step wall time in us, per-wave rows in step order) from a [num_tasks, TRACE_FIELDS] record tensor."""
    rec, f = task_fields(schedule, records)
    ran = ran_tasks(schedule, rec)
    t0, t1 = int(f["wait_start_ns"][ran].min()), int(f["end_ns"][ran].max())
    step_us = (t1 - t0) / 1e3
    by_wave: dict[str, list[int]] = defaultdict(list)
    order: list[str] = []
    for t in schedule.tasks:
        if t.wave not in by_wave:
            order.append(t.wave)
        if ran[t.index]:
            by_wave[t.wave].append(t.index)
    rows = []
    for wave in order:
        idx = torch.tensor(by_wave[wave])
        run = (f["end_ns"][idx] - f["run_start_ns"][idx]).double() / 1e3
        tail = (f["end_ns"][idx] - f["compute_end_ns"][idx]).double() / 1e3
        marked = idx[(f["inputs_ns"][idx] > 0) & (f["stages_ns"][idx] > 0)]
        inputs = (f["inputs_ns"][marked] - f["run_start_ns"][marked]).double() / 1e3
        stages = (f["stages_ns"][marked] - f["inputs_ns"][marked]).double() / 1e3
        wait = (f["run_start_ns"][idx] - f["wait_start_ns"][idx]).double() / 1e3
        per_layer: dict[int, list[int]] = defaultdict(list)
        for i in by_wave[wave]:
            per_layer[schedule.tasks[i].layer].append(i)
        spans = [(int(f["end_ns"][ix].max()) - int(f["run_start_ns"][ix].min())) / 1e3
                 for ix in (torch.tensor(v) for v in per_layer.values())]
        ops = sorted({schedule.tasks[i].op.name for i in by_wave[wave]})
        rows.append(WaveTime(
            wave=wave, ops="/".join(ops), layers=len(per_layer), tasks_per_layer=len(idx) / len(per_layer),
            sms=len(set(f["sm"][idx].tolist())), run_us=float(run.mean()),
            inputs_us=float(inputs.mean()) if len(marked) else 0.0,
            stages_us=float(stages.mean()) if len(marked) else 0.0, tail_us=float(tail.mean()),
            wait_us=float(wait.mean()),
            span_us=sum(spans) / len(spans), share=sum(spans) / step_us if step_us else 0.0,
        ))
    return step_us, rows


@dataclasses.dataclass
class LayerWave:
    wave: str
    tasks: int  # per layer
    first_run_us: float  # the wave's first task starting, after the layer's first task started
    median_end_us: float  # the median of its tasks' ends
    last_end_us: float  # its last task's end: when its barrier completed


def _ran_by_layer(schedule: Schedule, rec: torch.Tensor) -> dict[int, dict[str, list[int]]]:
    """{layer: {wave: indices of its tasks that ran}}."""
    ran = ran_tasks(schedule, rec).tolist()  # a list: indexing a tensor per task is slow at 385K tasks
    by_layer: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for t in schedule.tasks:
        if ran[t.index]:
            by_layer[t.layer][t.wave].append(t.index)
    return by_layer


def _tasks_by_layer(schedule: Schedule, rec: torch.Tensor, layers) -> tuple[dict[int, dict[str, list[int]]], list[int]]:
    """(_ran_by_layer, ``layers`` as a list), refusing layers without a following layer (a layer's times are read
    against the next one's start)."""
    by_layer = _ran_by_layer(schedule, rec)
    layers = list(layers)
    if not layers or any(layer + 1 not in by_layer for layer in layers):
        raise ValueError(f"layers {layers}: each needs a following layer in the schedule")
    return by_layer, layers


def middle_moe_layers(dims) -> list[int]:
    """The MoE layers a layer's times are read over (layer_timeline, layer_ends; the timing model's period):
    the first and last layers of a step start or end it differently."""
    return [i for i in range(2, dims.num_layers - 2) if not dims.dense[i]]


def layer_timeline(schedule: Schedule, records: torch.Tensor, layers) -> tuple[float, list[LayerWave]]:
    """(median start of the next layer, per-wave rows in step order) for ``layers`` (each needs a next
    layer): every time is relative to the start of the layer's first task, and the median over the
    layers. A layer's waves overlap, so this shows which one ends last and what waited behind what."""
    rec, f = task_fields(schedule, records)
    run, end = f["run_start_ns"], f["end_ns"]
    by_layer, layers = _tasks_by_layer(schedule, rec, layers)
    waves = list(by_layer[layers[0]])
    samples: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    period = []
    for layer in layers:
        t0 = min(int(run[i]) for ix in by_layer[layer].values() for i in ix)
        nxt = min(int(run[i]) for ix in by_layer[layer + 1].values() for i in ix)
        period.append((nxt - t0) / 1e3)
        for wave, ix in by_layer[layer].items():
            idx = torch.tensor(ix)
            ends = (end[idx] - t0).double() / 1e3
            samples[wave].append(((int(run[idx].min()) - t0) / 1e3, float(ends.median()), float(ends.max())))
    rows = []
    for wave in waves:
        cols = list(zip(*samples[wave]))
        rows.append(LayerWave(wave, len(by_layer[layers[0]][wave]),
                              *(float(torch.tensor(c).median()) for c in cols)))
    return float(torch.tensor(period).median()), rows


# The waves that write a layer's residual outputs o and mlp (or the expert outputs a following norm folds the MoE
# combine from, StepShape.combine_in_norm): the layer is done when the last of them ends.
RESIDUAL_WRITER_WAVES = ("o_proj", "mlp_down", "moe_combine")


@dataclasses.dataclass
class LayerPhases:
    """One MoE layer's period cut at its routing chain (medians over the layers, us; the parts of each layer sum
    to its period, their medians need not sum to the period's)."""

    boundary_us: float  # the previous layer's last o / mlp write -> this layer's first router task's rows staged
    routing_us: float  # -> this layer's first expert (mlp_up) task's run start
    experts_us: float  # -> this layer's last o / mlp write
    period_us: float  # the previous layer's last o / mlp write -> this layer's
    layers: int  # layers read


def _last_writer(by_layer: dict[int, dict[str, list[int]]], written: list[int], layer: int) -> int:
    """The task of ``layer`` (of _ran_by_layer) that wrote o or mlp last, by its compute end ``written``."""
    ix = [i for w in RESIDUAL_WRITER_WAVES for i in by_layer[layer].get(w, [])]
    if not ix:
        raise ValueError(f"layer {layer} wrote neither o nor mlp in this schedule")
    return max(ix, key=lambda i: written[i])


def layer_phases(schedule: Schedule, records: torch.Tensor, layers) -> LayerPhases:
    """:class:`LayerPhases` over ``layers`` (MoE layers with a router wave, each after a layer that wrote o and
    mlp). A write is the writer task's compute end: its outputs are stored then, before its fence and signal; the
    boundary holds the hand-over (fence, signal, poll). The chain starts at the router's inputs mark, the run start
    where a task has no mark: where the norm is folded (batch < 16) its rows normed and staged; where the norm runs
    as a wave the mark follows hn's read, a little after the run start, and the boundary holds the norm wave."""
    rec, f = task_fields(schedule, records)
    run, written, inputs = f["run_start_ns"], f["compute_end_ns"].tolist(), f["inputs_ns"]
    by_layer = _ran_by_layer(schedule, rec)

    def last_write(layer: int) -> int:
        return written[_last_writer(by_layer, written, layer)]

    parts = []
    for layer in layers:
        waves = by_layer[layer]
        if not waves.get("router") or not waves.get("mlp_up"):
            raise ValueError(f"layer {layer} has no router or no expert up/gate task that ran: not a MoE layer")
        before, after = last_write(layer - 1), last_write(layer)
        staged = min(int(inputs[i]) if int(inputs[i]) > 0 else int(run[i]) for i in waves["router"])
        experts = min(int(run[i]) for i in waves["mlp_up"])
        parts.append(((staged - before) / 1e3, (experts - staged) / 1e3, (after - experts) / 1e3, (after - before) / 1e3))
    medians = [float(torch.tensor(c).median()) for c in zip(*parts)]
    return LayerPhases(*medians, layers=len(parts))


def phases_markdown(p: LayerPhases, layers: str) -> str:
    return "\n".join([
        f"one MoE layer cut at its routing chain ({layers}, medians over {p.layers} layers, us): the previous "
        "layer's last o / mlp write, then this layer's first router task with its rows staged (boundary), its first "
        "expert task's run (routing), its own last o / mlp write (experts and the rest)", "",
        "| boundary | routing | experts and the rest | period |", "|---|---|---|---|",
        f"| {p.boundary_us:.1f} | {p.routing_us:.1f} | {p.experts_us:.1f} | {p.period_us:.1f} |"]) + "\n"


@dataclasses.dataclass
class PathPart:
    """Time a layer's critical path spends in one place (:func:`critical_path`)."""

    wave: str  # the task's wave; for a hop or a queue the waiting task's
    kind: str  # what the path does there (critical_path's docstring)
    us: float  # mean per layer over the layers read (0 in those whose path does not pass here)
    share: float  # of the mean period
    layers: int  # layers whose path passes here


@dataclasses.dataclass
class CriticalPath:
    period_us: float  # mean over the layers: the previous layer's last o / mlp write -> this layer's
    parts: list[PathPart]  # most time first; their us sum to period_us
    chains: list[tuple[str, int]]  # the path's tasks by wave from the previous layer's last write, most layers first
    layers: int


def critical_path(schedule: Schedule, records: torch.Tensor, layers, top: int = 3) -> CriticalPath:
    """What each layer's period waited on, walked back from the layer's last o / mlp write (a writer's compute
    end, as :func:`layer_phases`) to the previous layer's. At each task the walk asks what held its run start:

    - its inputs, when the last signal among the barriers it waits on (for a routed expert task also its
      producer's wait on the routing) came after its SM was free (its previous task's consumers done): the path
      goes to that barrier's last signaller, through ``hop from <wave>`` (the signal's end stamp -> this run
      start: the polls, the acquire, for a routed task the producer's route reads) and the signaller's ``tail``
      (its compute end -> end stamp: the hand-over to the signaller warp, the fence, the signal);
    - otherwise its SM: ``queued`` (the SM's previous task's compute end -> this run start: the loop's own work,
      the dependency check that found the inputs done) and on to that previous task;
    - a routed task under posted routing (its ``load_post``): when the top-k's compute end (its words were
      posted before it) came after both its SM was free and its barriers' last signal, ``posted from <wave>``
      (that compute end -> the run start: the producer's polls) and on to the top-k;
    - a task that polls its inputs' own words (``Task.polls_inputs``; its run start is where its poll ended,
      :func:`task_fields`): when the last of their writers' bodies ended after its SM was free, ``polled from
      <wave>`` (that body's end -> the run start) and on to that writer.

    A task whose SM had nothing before it and none of whose inputs ran gives the rest of the period as its
    ``start``. A task's own time is ``inputs`` / ``stages`` / ``finish`` by its marks (:func:`summarize`'s phases;
    ``run`` where it has none).
    The walk only moves back in time (a part ends where the last one began: the top-k posts its words before its
    compute end, so an expert task can start before it), so the parts of a layer sum to its period; they are averaged over the layers (means, so
    that they still sum to the mean period). ``chains``: the path's waves in time order, ``>`` a signal edge,
    ``~`` a task run after the one before it on the same SM (``wave xN``: N tasks of a wave so in a row), the
    ``top`` most frequent with their layer counts."""
    rec, f = task_fields(schedule, records)
    by_layer, layers = _tasks_by_layer(schedule, rec, layers)
    sm, end, done, run0, inputs, stages = (f[n].tolist() for n in ("sm", "end_ns", "compute_end_ns", "run_start_ns",
                                                                    "inputs_ns", "stages_ns"))
    ran = ran_tasks(schedule, rec).tolist()
    staged = _staged(f).tolist()
    last = _last_signallers(schedule, ran, end)  # barrier -> its signaller that signalled last
    written = _last_signallers(schedule, ran, done)  # barrier -> its signaller whose body ended last
    previous = {b: a for ix in _sm_run_order(schedule, ran, sm, run0) for a, b in zip(ix, ix[1:])}

    def last_write(layer: int) -> int:
        return _last_writer(by_layer, done, layer)

    if any(layer < 1 for layer in layers):
        raise ValueError(f"layers {layers}: each needs a layer before it (the walk ends at its last write)")
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * len(layers))
    chains: dict[str, int] = defaultdict(int)
    periods = []
    for n, layer in enumerate(layers):
        t0, cur = done[last_write(layer - 1)], last_write(layer)
        cursor = done[cur]  # the walk covers [t0, cursor) and only moves down, so no time is counted twice
        periods.append((cursor - t0) / 1e3)
        chain = [schedule.tasks[cur].wave]

        def add(wave: str, kind: str, lo: int) -> bool:
            """The part [lo, cursor), clipped at t0, then the cursor at lo; True once the walk has reached t0."""
            nonlocal cursor
            lo = max(lo, t0)
            if lo < cursor:
                totals[(wave, kind)][n] += (cursor - lo) / 1e3
                cursor = lo
            return cursor <= t0

        reached = False
        while not reached:
            t = schedule.tasks[cur]
            barriers = () if t.waits_only_if_work and not staged[cur] else \
                t.waits + ((t.load_wait,) if t.op in abi.ROUTED_OPS and t.load_wait != abi.NO_BARRIER else ())
            sig = max((last[b] for b in set(barriers) if b in last), key=lambda i: end[i], default=None)
            # posted routing: the producer polls the top-k's posted words after the router wave's barrier
            post = t.load_post if t.op in abi.ROUTED_OPS and t.load_post >= 0 and ran[t.load_post] else None
            prev = previous.get(cur)
            ready = done[prev] if prev is not None else 0
            # (marks that span the whole body, as timing.Timed.records writes them, say nothing of its phases)
            marked = inputs[cur] > 0 and stages[cur] > 0 and (inputs[cur], stages[cur]) != (run0[cur], done[cur])
            own = [("finish", stages[cur]), ("stages", inputs[cur]), ("inputs", run0[cur])] if marked \
                else [("run", run0[cur])]
            for kind, lo in own:
                if add(t.wave, kind, lo):
                    reached = True
                    break
            if reached:
                break
            # posted scores: the task polled its inputs' words, which were in once their writers' bodies ended
            polled = max((written[b] for b in set(t.waits) if b in written), key=lambda i: done[i], default=None) \
                if t.polls_inputs else None
            if polled is not None and done[polled] > ready:
                reached = add(t.wave, f"polled from {schedule.tasks[polled].wave}", done[polled])
                cur, edge = polled, " > "
            elif post is not None and done[post] > max(ready, end[sig] if sig is not None else 0):
                reached = add(t.wave, f"posted from {schedule.tasks[post].wave}", done[post])
                cur, edge = post, " > "
            elif sig is not None and end[sig] > ready:
                reached = add(t.wave, f"hop from {schedule.tasks[sig].wave}", end[sig]) or \
                    add(schedule.tasks[sig].wave, "tail", done[sig])
                cur, edge = sig, " > "
            elif prev is not None:
                reached = add(t.wave, "queued", done[prev])
                cur, edge = prev, " ~ "
            else:  # the SM's first task, nothing it waited for ran: the rest of the period is its start
                add(t.wave, "start", t0)
                break
            chain.append(edge)
            chain.append(schedule.tasks[cur].wave)
        chains[_chain_text(chain[::-1])] += 1

    period = sum(periods) / len(periods)
    parts = [PathPart(w, k, sum(v) / len(v), sum(v) / len(v) / period if period else 0.0, sum(1 for x in v if x > 0))
             for (w, k), v in totals.items()]
    parts = sorted((p for p in parts if p.layers), key=lambda p: (-p.us, p.wave, p.kind))
    ranked = sorted(chains.items(), key=lambda c: (-c[1], c[0]))[:top]
    return CriticalPath(period, parts, ranked, len(layers))


def _chain_text(chain: list[str]) -> str:
    """[wave, edge, wave, ...] in time order as text, a run of one wave's tasks on one SM as "wave xN"."""
    out, k = [], 0
    while k < len(chain):
        n = 1
        while k + 2 * n < len(chain) and chain[k + 2 * n] == chain[k] and chain[k + 2 * n - 1] == " ~ ":
            n += 1
        out.append(chain[k] + (f" x{n}" if n > 1 else ""))
        if k + 2 * n - 1 < len(chain):
            out.append(chain[k + 2 * n - 1])
        k += 2 * n
    return "".join(out)


def critical_markdown(p: CriticalPath, layers: str) -> str:
    lines = [f"what each layer's period waited on ({layers}, {p.layers} layers; walked back from the layer's last o / "
             "mlp write to the previous layer's: a task's own phases, the signal hops and tails it waited for, or "
             "the SM's previous task it was queued behind; means over the layers, us)", "",
             f"period {p.period_us:.1f} us", "", "| wave | part | us | share | layers |", "|---|---|---|---|---|"]
    for r in p.parts:
        lines.append(f"| {r.wave} | {r.kind} | {r.us:.2f} | {100 * r.share:.0f}% | {r.layers} |")
    lines += ["", "| the path's waves (> signal, ~ same SM) | layers |", "|---|---|"]
    lines += [f"| {c} | {k} |" for c, k in p.chains]
    return "\n".join(lines) + "\n"


@dataclasses.dataclass
class SMEnds:
    """The SMs whose last task of a layer belongs to one wave."""

    wave: str
    sms: float  # such SMs per layer (mean over the layers)
    run_start_us: float  # their last tasks' run start (median; after the layer's first task started)
    end_us: float  # their last tasks' end (median)
    wait_us: float  # their last tasks' wait on input barriers (median)


def _median(values: list[float]) -> float:
    return float(torch.tensor(values, dtype=torch.float64).median())


def _p90(values: list[float]) -> float:
    return float(torch.tensor(values, dtype=torch.float64).quantile(0.9))


def layer_ends(schedule: Schedule, records: torch.Tensor, layers) -> tuple[dict[str, float], list[SMEnds]]:
    """({"first", "half", "p90", "last", "next_layer"}: when the first SM, half of the SMs, 90% of them and
    the last one had finished their last task of the layer, and when the next layer's first task ran,
    medians over ``layers``; per-wave rows for those last tasks, most SMs first). Times as in
    :func:`layer_timeline`; an SM with no task in a layer does not count for it."""
    rec, f = task_fields(schedule, records)
    by_wave, layers = _tasks_by_layer(schedule, rec, layers)
    by_layer = {layer: [i for ix in waves.values() for i in ix] for layer, waves in by_wave.items()}
    marks: dict[str, list[float]] = defaultdict(list)
    last_tasks: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for layer in layers:
        ix = by_layer[layer]
        t0 = min(int(f["run_start_ns"][i]) for i in ix)
        last: dict[int, int] = {}  # SM -> its task of the layer that ended last
        for i in ix:
            sm = int(f["sm"][i])
            if sm not in last or int(f["end_ns"][i]) > int(f["end_ns"][last[sm]]):
                last[sm] = i
        ends = sorted((int(f["end_ns"][i]) - t0) / 1e3 for i in last.values())
        n = len(ends)
        for name, k in (("first", 0), ("half", (n - 1) // 2), ("p90", -(-9 * n // 10) - 1), ("last", n - 1)):
            marks[name].append(ends[k])
        marks["next_layer"].append((min(int(f["run_start_ns"][i]) for i in by_layer[layer + 1]) - t0) / 1e3)
        for i in last.values():
            last_tasks[schedule.tasks[i].wave].append(((int(f["run_start_ns"][i]) - t0) / 1e3,
                                                       (int(f["end_ns"][i]) - t0) / 1e3,
                                                       (int(f["run_start_ns"][i]) - int(f["wait_start_ns"][i])) / 1e3))
    spread = {name: _median(v) for name, v in marks.items()}
    rows = [SMEnds(wave, len(v) / len(layers), *(_median(list(c)) for c in zip(*v)))
            for wave, v in last_tasks.items()]
    rows.sort(key=lambda r: (-r.sms, r.wave))
    return spread, rows


@dataclasses.dataclass
class AfterPrevious:
    """A wave's tasks split by the opcode of the task their SM ran just before: a task after one of its own
    opcode finds that opcode's code warm in the SM's instruction caches, and (the second of two on an SM)
    often runs while fewer SMs stream; a task after another opcode starts cold."""

    wave: str
    same: int  # tasks whose SM's previous task had the same opcode
    same_run_us: float | None  # their mean run time (None if none)
    same_inputs_us: float | None  # their mean inputs phase (ops that mark it; None if none)
    other: int  # tasks whose SM's previous task had another opcode (or that are the SM's first)
    other_run_us: float | None
    other_inputs_us: float | None


def after_previous(ops: list[int], waves: list[str], records: torch.Tensor, ran: torch.Tensor) -> list[AfterPrevious]:
    """Per wave (in first-task order), its tasks that ran split by the opcode of their SM's previous task
    (by run start). Plain lists, so that a saved trace (kernel_profile's traces.pt: op, waves, sm, and times
    with -1 for fields a task did not mark) can be read without its schedule: ``records`` then is
    ``torch.cat([sm[:, None], times], 1)`` and ``ran`` is ``times[:, -1] >= 0``."""
    rec, f = record_fields(records)
    previous: dict[int, int] = {}  # task -> the op its SM ran just before it (absent: the SM's first)
    by_sm: dict[int, list[int]] = defaultdict(list)
    for i in range(len(ops)):
        if ran[i]:
            by_sm[int(f["sm"][i])].append(i)
    for tasks in by_sm.values():
        tasks.sort(key=lambda i: int(f["run_start_ns"][i]))
        for before, i in zip(tasks, tasks[1:]):
            previous[i] = ops[before]
    groups: dict[str, dict[bool, list[int]]] = {}
    for i in range(len(ops)):
        if ran[i]:
            groups.setdefault(waves[i], {True: [], False: []})[previous.get(i) == ops[i]].append(i)

    def means(ix: list[int]) -> tuple[float | None, float | None]:  # None, not nan: profile.json stays JSON
        if not ix:
            return None, None
        t = torch.tensor(ix)
        run = (f["end_ns"][t] - f["run_start_ns"][t]).double() / 1e3
        marked = t[f["inputs_ns"][t] > 0]
        inputs = (f["inputs_ns"][marked] - f["run_start_ns"][marked]).double() / 1e3
        return float(run.mean()), float(inputs.mean()) if len(marked) else None

    return [AfterPrevious(wave, len(g[True]), *means(g[True]), len(g[False]), *means(g[False]))
            for wave, g in groups.items()]


def after_previous_markdown(rows: list[AfterPrevious]) -> str:
    def us(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    lines = ["task run time by the opcode of the SM's previous task (us; inputs: until the activation rows were "
             "staged)", "",
             "| wave | after its own opcode | run | inputs | after another | run | inputs |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.wave} | {r.same} | {us(r.same_run_us)} | {us(r.same_inputs_us)} | {r.other} | "
                     f"{us(r.other_run_us)} | {us(r.other_inputs_us)} |")
    return "\n".join(lines) + "\n"


def _staged(f: dict[str, torch.Tensor]) -> torch.Tensor:
    """bool per task: it marked a stage phase (its activation rows staged, then its last stage consumed)."""
    return (f["inputs_ns"] > 0) & (f["stages_ns"] >= f["inputs_ns"])


def task_bytes(schedule: Schedule, records: torch.Tensor, bytes_of) -> torch.Tensor:
    """Each task's share of the bytes its wave moves in its layer (``bytes_of(wave, layer)``; None or 0 for a wave
    that moves none), shared equally among the wave's tasks of that layer that ran a stage phase (inputs and
    stages marked: a skipped expert tile or an empty attention split takes none); 0 for every other task."""
    _, f = task_fields(schedule, records)
    staged = _staged(f).tolist()
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    for t in schedule.tasks:
        if staged[t.index]:
            groups[(t.wave, t.layer)].append(t.index)
    out = torch.zeros(len(schedule.tasks), dtype=torch.float64)
    for (wave, layer), ix in groups.items():
        out[ix] = float(bytes_of(wave, layer) or 0.0) / len(ix)
    return out


@dataclasses.dataclass
class ActivityBin:
    """One stretch of a layer: medians over the layers of what every task (of any layer) did in it."""

    start_us: float  # after the layer's first task started
    waiting: float  # SMs whose consumers waited on a task's input barriers (averaged over the stretch)
    running: float  # SMs whose consumers run a task: from the end of its wait until they are done with it (the
    # fence and signal after that are the signaller warp's, while the consumers go on to their next task)
    consumed_gbs: float  # bytes the consumers took in the stretch: each task's bytes over its stage phase


ACTIVITY_BINS_US = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)


def layer_activity(schedule: Schedule, records: torch.Tensor, layers, nbytes: torch.Tensor,
                   bin_us: float | None = None) -> list[ActivityBin]:
    """``layers`` cut into stretches of ``bin_us`` (default: the first of ACTIVITY_BINS_US that makes at most 30
    of them) from each layer's first task's start until its last task's end (the median over the layers);
    ``nbytes`` each task's bytes (:func:`task_bytes`). A task's bytes are counted while its consumers take them,
    from its activation rows being staged to its last stage consumed; HBM moved them earlier (the producer runs
    ahead), so a stretch's rate is a consumption rate."""
    rec, f = task_fields(schedule, records)
    by_layer, layers = _tasks_by_layer(schedule, rec, layers)
    idx = ran_tasks(schedule, rec).nonzero().flatten()
    # Every time from here on is float64 ns after the step's first wait. The records are globaltimer stamps
    # (~1.8e18 ns): compared with a Python float they would be promoted to float32 (2^37 ns steps) and even as
    # float64 they would round to 256 ns; after the subtraction they are small integers, exact in float64.
    base = int(f["wait_start_ns"][idx].min())

    def since(name):
        return (f[name] - base).to(torch.float64)

    wait0, run0, end, done = (since(n)[idx] for n in ("wait_start_ns", "run_start_ns", "end_ns", "compute_end_ns"))
    staged = _staged(f)[idx]
    s0 = torch.where(staged, since("inputs_ns")[idx], 0.0)
    s1 = torch.where(staged, since("stages_ns")[idx], 0.0)
    share = nbytes.to(torch.float64)[idx]
    starts, spans = [], []
    for layer in layers:
        mine = [i for ix in by_layer[layer].values() for i in ix]
        t0 = int(f["run_start_ns"][mine].min()) - base
        starts.append(t0)
        spans.append(int(f["end_ns"][mine].max()) - base - t0)
    span = float(torch.tensor(spans, dtype=torch.float64).median())
    if bin_us is None:
        bin_us = next((b for b in ACTIVITY_BINS_US if span <= 30 * b * 1e3), ACTIVITY_BINS_US[-1])
    bin_ns = bin_us * 1e3
    nbins = max(1, int(-(-span // bin_ns)))

    def overlap(lo, hi, a, b):  # [bins, tasks] ns of [a, b) inside each [lo, hi)
        return (torch.minimum(b[None, :], hi[:, None]) - torch.maximum(a[None, :], lo[:, None])).clamp(min=0)

    per_layer = []
    for t0 in starts:
        near = (end > t0) & (wait0 < t0 + nbins * bin_ns)  # the tasks of this stretch of the step, of any layer
        a, b, e = wait0[near].double(), run0[near].double(), done[near].double()
        lo = t0 + bin_ns * torch.arange(nbins, dtype=torch.float64)
        hi = lo + bin_ns
        w = overlap(lo, hi, a, b).sum(1) / bin_ns
        r = overlap(lo, hi, b, e).sum(1) / bin_ns
        x0, x1 = s0[near].double(), s1[near].double()
        frac = overlap(lo, hi, x0, x1) / (x1 - x0).clamp(min=1.0)
        c = (frac * share[near][None, :]).sum(1) / bin_ns  # bytes per ns = GB/s
        per_layer.append(torch.stack([w, r, c], dim=1))
    med = torch.stack(per_layer).median(dim=0).values
    return [ActivityBin(i * bin_us, float(med[i, 0]), float(med[i, 1]), float(med[i, 2])) for i in range(nbins)]


def _sm_run_order(schedule: Schedule, ran: list[bool], sm: list[int], run0: list[int]) -> list[list[int]]:
    """Each SM's tasks that ran, in the order its consumers ran them (run start; task index on a tie)."""
    on_sm: dict[int, list[int]] = defaultdict(list)
    for t in schedule.tasks:
        if ran[t.index]:
            on_sm[sm[t.index]].append(t.index)
    for ix in on_sm.values():
        ix.sort(key=lambda i: (run0[i], i))
    return list(on_sm.values())


def _last_signallers(schedule: Schedule, ran: list[bool], stamp: list[int]) -> dict[int, int]:
    """Each barrier's signaller (a task that ran) with the latest ``stamp``: barrier -> its task index (the first
    in task order on a tie)."""
    last: dict[int, int] = {}
    for t in schedule.tasks:
        if not ran[t.index] or t.signal == abi.NO_BARRIER:
            continue
        if t.signal not in last or stamp[t.index] > stamp[last[t.signal]]:
            last[t.signal] = t.index
    return last


def _last_signals(schedule: Schedule, ran: list[bool], end: list[int]) -> dict[int, tuple[int, str]]:
    """Each barrier's last signal: barrier -> (its last signaller's end stamp, that signaller's wave)."""
    return {b: (end[i], schedule.tasks[i].wave) for b, i in _last_signallers(schedule, ran, end).items()}


@dataclasses.dataclass
class Hop:
    """One kind of dependency edge: the waves of the tasks that signalled a barrier and of the tasks that were
    still waiting on it when the last signal came (medians over those waits)."""

    signaller: str  # the wave of the barrier's last signaller
    waiter: str
    waits: int  # waits of the waiter wave whose last-satisfied barrier this was and that were blocked on it
    hop_us: float  # from the last signaller's end stamp (its fence done, the signal next) to the waiter's run
    p90_us: float


def layer_hops(schedule: Schedule, records: torch.Tensor, layers) -> list[Hop]:
    """How long a signal takes to start the task waiting for it, per (signaller wave, waiter wave), over the
    tasks of ``layers``. A task's barriers here are those its consumers wait on, and for a routed expert task
    also its producer's wait on the routing (the consumers see its descriptor only after that); of them, the
    one whose last signaller ended last. When that end came after the SM was free for the task (its previous
    task's consumers done), the task was blocked on it: the time from that end to the task's run start is the
    signal's path (the red to L2, the polls, the acquire, the consumers' hand-over; for a routed task also its
    producer's reads of the route words). A producer's other waits (an attention split's new token) are not
    seen by the consumers' stamps and are left out, and so is a task that polled its inputs' words instead of
    waiting on a signal (``Task.polls_inputs``). Most waits first."""
    rec, f = task_fields(schedule, records)
    by_layer, layers = _tasks_by_layer(schedule, rec, layers)
    sm, end, done, run0 = (f[n].tolist() for n in ("sm", "end_ns", "compute_end_ns", "run_start_ns"))
    ran = ran_tasks(schedule, rec).tolist()
    staged = _staged(f).tolist()  # a task that waits only if it has work and had none marked no stage phase
    last = _last_signals(schedule, ran, end)
    # task -> when its SM's consumers finished the task before it (absent, so 0: the SM's first)
    ready = {b: done[a] for ix in _sm_run_order(schedule, ran, sm, run0) for a, b in zip(ix, ix[1:])}
    hops: dict[tuple[str, str], list[float]] = defaultdict(list)
    for layer in layers:
        for ix in by_layer[layer].values():
            for i in ix:
                t = schedule.tasks[i]
                if t.waits_only_if_work and not staged[i] or t.polls_inputs:
                    continue  # nothing to do on this step: it did not wait; or it polled its inputs, not a signal
                barriers = t.waits + ((t.load_wait,) if t.op in abi.ROUTED_OPS else ())
                seen = [last[b] for b in set(barriers) if b in last]
                if not seen:
                    continue
                at, wave = max(seen)
                if at > ready.get(i, 0):  # the SM was free before the last signal: blocked on it
                    hops[(wave, t.wave)].append((run0[i] - at) / 1e3)
    rows = [Hop(s, w, len(v), _median(v), _p90(v)) for (s, w), v in hops.items()]
    return sorted(rows, key=lambda r: (-r.waits, r.signaller, r.waiter))


@dataclasses.dataclass
class Check:
    """A wave's dependency checks that found every input already signalled: from the consumer leader's wait start
    to the task's run start, the cost of looking alone (the barriers' polls and the acquire; PERF_LOG #139)."""

    wave: str
    checks: int
    check_us: float  # median
    p90_us: float


CHECK_LEAD_NS = 3000  # input_checks: an input signalled at least this long before the wait began was done


def input_checks(schedule: Schedule, records: torch.Tensor, layers, lead_ns: int = CHECK_LEAD_NS) -> list[Check]:
    """What a dependency wait costs when there is nothing to wait for, per wave, over the tasks of ``layers``
    whose every waited barrier had its last signal at least ``lead_ns`` before the consumer leader's wait began:
    the wait's start to the run start. A barrier the leader has seen complete before costs no round trip (it is
    cached on the SM); one it has not costs an acquire poll (`ld.acquire.gpu`, one L2 round trip; before session
    AD a relaxed poll and a fence, which waited for the SM's copies in flight). A task that waits only if it has work and had none is left out, and so is one with a
    waited barrier that no task signalled. Most checks first."""
    rec, f = task_fields(schedule, records)
    by_layer, layers = _tasks_by_layer(schedule, rec, layers)
    end, wait0, run0 = (f[n].tolist() for n in ("end_ns", "wait_start_ns", "run_start_ns"))
    ran = ran_tasks(schedule, rec).tolist()
    staged = _staged(f).tolist()
    last = _last_signals(schedule, ran, end)
    checks: dict[str, list[float]] = defaultdict(list)
    for layer in layers:
        for ix in by_layer[layer].values():
            for i in ix:
                t = schedule.tasks[i]
                waits = [b for b in t.waits if b != abi.NO_BARRIER]
                if not waits or (t.waits_only_if_work and not staged[i]) or any(b not in last for b in waits):
                    continue
                if max(last[b][0] for b in waits) <= wait0[i] - lead_ns:
                    checks[t.wave].append((run0[i] - wait0[i]) / 1e3)
    rows = [Check(w, len(v), _median(v), _p90(v)) for w, v in checks.items()]
    return sorted(rows, key=lambda r: (-r.checks, r.wave))


def checks_markdown(rows: list[Check], layers: str, lead_ns: int = CHECK_LEAD_NS) -> str:
    lines = [f"dependency checks that found their inputs done ({layers}; every waited barrier's last signal at least "
             f"{lead_ns / 1e3:g} us before the consumer leader's wait began; from that wait's start to the run start: "
             "the polls and the acquire)", "", "| wave | checks | median us | p90 us |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.wave} | {r.checks} | {r.check_us:.2f} | {r.p90_us:.2f} |")
    return "\n".join(lines) + "\n"


@dataclasses.dataclass
class Tail:
    """A kind of task's signal tail: from its consumers' end (the compute-end stamp) to its signal (the end stamp,
    taken after the signaller's fence), by the task's wave and the wave its SM's consumers ran next."""

    wave: str
    next_wave: str  # of the task that ran next on the same SM
    tasks: int
    tail_us: float  # median
    p90_us: float


def signal_tails(schedule: Schedule, records: torch.Tensor, layers) -> list[Tail]:
    """How long each task's signal came after its consumers finished (the hand-over to the signaller and its
    ``fence.acq_rel.gpu``), over the tasks of ``layers`` that have a next task on their SM, grouped by (wave,
    the next task's wave): a fence that waits behind its SM's in-flight copies shows as a longer tail where the
    SM's producer streams the tasks after it (PERF_LOG #133). Most tasks first."""
    rec, f = task_fields(schedule, records)
    by_layer, layers = _tasks_by_layer(schedule, rec, layers)
    sm, end, done, run0 = (f[n].tolist() for n in ("sm", "end_ns", "compute_end_ns", "run_start_ns"))
    ran = ran_tasks(schedule, rec).tolist()
    # task -> the task its SM ran next
    following = {a: b for ix in _sm_run_order(schedule, ran, sm, run0) for a, b in zip(ix, ix[1:])}
    tails: dict[tuple[str, str], list[float]] = defaultdict(list)
    for layer in layers:
        for ix in by_layer[layer].values():
            for i in ix:
                if i in following:
                    tails[(schedule.tasks[i].wave, schedule.tasks[following[i]].wave)].append((end[i] - done[i]) / 1e3)
    rows = [Tail(w, n, len(v), _median(v), _p90(v)) for (w, n), v in tails.items()]
    return sorted(rows, key=lambda r: (-r.tasks, r.wave, r.next_wave))


def tails_markdown(rows: list[Tail], layers: str) -> str:
    lines = [f"signal tails, per wave and the wave its SM ran next ({layers}; from the consumers' end to the signal: "
             "the hand-over to the signaller and its fence)", "",
             "| wave | next wave on the SM | tasks | median us | p90 us |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.wave} | {r.next_wave} | {r.tasks} | {r.tail_us:.2f} | {r.p90_us:.2f} |")
    return "\n".join(lines) + "\n"


def hops_markdown(rows: list[Hop], layers: str) -> str:
    lines = [f"signal to run, per dependency edge ({layers}; tasks blocked on their last-satisfied barrier; from the "
             "last signaller's end stamp to the waiter's run start; a routed expert task's includes its producer's "
             "route reads)", "", "| signaller wave | waiter wave | blocked waits | median us | p90 us |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.signaller} | {r.waiter} | {r.waits} | {r.hop_us:.2f} | {r.p90_us:.2f} |")
    return "\n".join(lines) + "\n"


def activity_markdown(rows: list[ActivityBin], layers: str, bandwidth: float | None = None) -> str:
    lines = [f"what the SMs do over a layer ({layers}, medians; us after the layer's first task started; every "
             "task running then counts, of any layer; consumed: each streaming task's share of its wave's bytes "
             "spread over its stage phase, when the consumers took the bytes, which HBM moved earlier)", "",
             "| from us | SMs waiting | SMs running | consumed GB/s | % of copy |", "|---|---|---|---|---|"]
    for r in rows:
        pct = f"{100 * r.consumed_gbs * 1e9 / bandwidth:.0f}%" if bandwidth else "-"
        lines.append(f"| {r.start_us:.0f} | {r.waiting:.0f} | {r.running:.0f} | {r.consumed_gbs:.0f} | {pct} |")
    return "\n".join(lines) + "\n"


def ends_markdown(spread: dict[str, float], rows: list[SMEnds], layers: str) -> str:
    lines = [f"when the SMs finish the layer ({layers}, medians; us after the layer's first task started): the "
             f"first SM at {spread['first']:.1f}, half of them by {spread['half']:.1f}, 90% by {spread['p90']:.1f}, "
             f"the last at {spread['last']:.1f}; the next layer's first task at {spread['next_layer']:.1f}", "",
             "| wave of an SM's last task | SMs | its run start | its end | its wait |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.wave} | {r.sms:.1f} | {r.run_start_us:.1f} | {r.end_us:.1f} | {r.wait_us:.1f} |")
    return "\n".join(lines) + "\n"


def timeline_markdown(next_layer_us: float, rows: list[LayerWave], layers: str) -> str:
    lines = [f"one layer's critical path ({layers}, medians; us after the layer's first task started; the "
             f"next layer's first task: {next_layer_us:.1f} us)", "",
             "| wave | tasks | first run | median end | last end |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.wave} | {r.tasks} | {r.first_run_us:.1f} | {r.median_end_us:.1f} | {r.last_end_us:.1f} |")
    return "\n".join(lines) + "\n"


def markdown(step_us: float, rows: list[WaveTime]) -> str:
    lines = [f"step wall time (traced launch): {step_us:.1f} us", "",
             "| wave | opcodes | layers | tasks/layer | SMs | task run us | inputs | stages | tail | task wait us "
             "| span us/layer | share |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.wave} | {r.ops} | {r.layers} | {r.tasks_per_layer:.0f} | {r.sms} | {r.run_us:.1f} | "
                     f"{r.inputs_us:.1f} | {r.stages_us:.1f} | {r.tail_us:.1f} | {r.wait_us:.1f} | {r.span_us:.1f} | "
                     f"{100 * r.share:.0f}% |")
    return "\n".join(lines) + "\n"

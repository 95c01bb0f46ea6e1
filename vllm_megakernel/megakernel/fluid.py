"""A bandwidth-aware timing model of a schedule: megakernel.timing with the bytes in it.

megakernel.timing gives every task its wave's measured run time whatever streams beside it, so it cannot say
what a change of task sizes, bytes in flight or overlap does. Here each SM has the kernel's two sides:

- a producer that walks the SM's list in order and streams each task's weight and K/V bytes into a ring of
  ``ring_bytes`` (the kernel's 5 x 32 KB), ahead of the consumers and before the task's inputs are ready; a
  routed expert task's producer first claims its tile (when it reaches the place, as the kernel's producer
  does) and waits for its layer's routing (``load_wait``) before its bytes; a place past the live tiles is
  skipped once its routing is known, and so are the SM's later places of that wave without a claim (the kernel's
  exhausted claim counter); under posted routing the producer also waits for the top-k's selection (its words);
- consumers that start a task once the SM's previous task is done (plus ``gap_us``) and its barriers have
  completed (plus ``hop_us``; a task that polls its inputs' own words, ``Task.polls_inputs``, once the barrier's
  last signaller finished its body, without its tail: under uniform routing the kernel's top-k waits on the barrier
  instead, which the model does not know), spend the wave's measured inputs phase, then take the task's
  bytes as they land,
  no faster than one 32 KB stage per stage_us (freeing the ring), then the rest of the body, and signal
  ``tail_us`` after the body's end while the SM goes on (the signaller warp).

Bandwidth: a streaming producer keeps up to ``stages_in_flight`` x 32 KB (and no more than its ring's free
room, and no more than its task still needs) requested; the HBM serves the whole GPU's requests at the rate the
fence probe measured for that many bytes in flight (PROBE_BANDWIDTH, scaled to the run's copy bandwidth), and at
most at (bytes requested) / ``latency_us``; each producer gets its share in proportion to the bytes it has
requested. A rate, not a delay: a task's first bytes land in the step after they are asked for.
Nothing else is modelled: no compute floor on the stage phases, no fence that waits for the copies in flight
(the measured tail is taken as it is), no L2. Simulated in steps of ``dt_us``.

Per-wave costs come from a traced profile (kernel_profile's "waves": inputs_us, stages_us, tail_us and run_us):
a wave's body other than its stage phase is a fixed cost, and a wave that moves no bytes keeps its measured
stage phase as work (the top-k's rounds, the attention combine's sums). Bytes per task: ``task_bytes``.
"""

from __future__ import annotations

import dataclasses
import math

from vllm_megakernel.megakernel import layout
from vllm_megakernel.megakernel.abi import NO_BARRIER, ROUTED_OPS, Op
from vllm_megakernel.megakernel.schedule import Schedule
from vllm_megakernel.megakernel.timing import Timed, claim_waves, dead_tasks

STAGE_BYTES = 32 * 1024
STALL_US = 20_000.0  # model time without a task done that counts as a deadlock


@dataclasses.dataclass(frozen=True)
class WaveCost:
    inputs_us: float  # the body's time before its bytes (activation rows staged)
    stage_work_us: float  # the stage phase's own work where the wave moves no bytes (else 0: the bytes set it)
    finish_us: float  # the body's time after its last stage
    tail_us: float  # the body's end to its signal


def costs_from_profile(row: dict) -> dict[str, WaveCost]:
    """Per-wave costs from one row of kernel_profile's profile.json ("waves"; a row without the phases, from before
    they were traced, gives the whole body as the finish)."""
    out = {}
    for w in row["waves"]:
        inputs, stages, tail = (w.get(k, 0.0) for k in ("inputs_us", "stages_us", "tail_us"))
        finish = max(0.0, w["run_us"] - tail - inputs - stages)
        out[w["wave"]] = WaveCost(inputs, stages, finish, tail)
    return out


def task_bytes(schedule: Schedule, seq_lens: list[int], moe_intermediate: int, dense_intermediate: int) -> list[float]:
    """The weight and K/V bytes each task streams: its weight rows (or columns) at 2 bytes, an attention split
    its 16-token tiles of K and V (every KV head), 0 for tasks that stream none (norms, combines, the top-k).
    ``seq_lens``: each request's tokens including the new one."""
    dims, shape = schedule.dims, schedule.shape
    h, d, q = dims.hidden, dims.head_dim, dims.num_heads * dims.head_dim
    moe_i = moe_intermediate
    out = []
    for t in schedule.tasks:
        f = t.fields
        if t.op in (Op.QKV_ROPE, Op.ROUTER):
            n = f["rows"] * h
        elif t.op == Op.O_PROJ:
            n = f["rows"] * q
        elif t.op == Op.MOE_UPGATE:
            n = 2 * f["cols"] * h
        elif t.op == Op.MOE_DOWN:
            n = min(f["rows"], h - f["row0"]) * moe_i
        elif t.op == Op.DENSE_UPGATE:
            n = 2 * f["cols"] * h
        elif t.op == Op.DENSE_DOWN:
            n = f["rows"] * dense_intermediate
        elif t.op == Op.ATTN_PARTIAL:
            window = dims.sliding_window if dims.sliding[t.layer] else None
            first, per, used = layout.attn_split_tiles(seq_lens[f["request"]], window, shape.attn_splits,
                                                       shape.attn_min_tiles, shape.attn_live_splits,
                                                       shape.attn_max_tiles)
            s = f["split"]
            last = -(-seq_lens[f["request"]] // layout.ATTN_TILE)
            tiles = max(0, min(last, first + (s + 1) * per) - (first + s * per)) if s < used else 0
            n = tiles * layout.ATTN_TILE * 2 * dims.num_kv_heads * d
        else:
            n = 0
        out.append(2.0 * n)
    return out


# HBM throughput against the bytes in flight on the whole GPU, every SM streaming 16 KB copies: the fence probe's
# streaming side (PERF_LOG #135, session AC call 1; 132 SMs at 16 / 32 / 48 / 64 / 96 / 160 KB each): (MB in
# flight, TB/s). Fewer requests in flight leave the HBM's banks idle however long each one takes.
PROBE_BANDWIDTH = ((0.0, 0.0), (2.16, 2.71), (4.33, 4.14), (6.49, 4.56), (8.65, 4.62), (12.98, 4.68), (21.6, 4.68))
# The copy bandwidth of the GPU the probe ran on (an H200: PERF_LOG's header, 4.24 TB/s), against which another run's
# copy bandwidth scales the curve (bandwidth_scale_for).
PROBE_COPY_BANDWIDTH = 4.24e12


def bandwidth_scale_for(profile: dict) -> float:
    """The curve's scale for a kernel_profile profile.json: its measured copy bandwidth against the probe GPU's (an
    H100's 2.98 TB/s gives 0.70); 1 where the profile has none."""
    measured = profile.get("bandwidth_bytes_per_s")
    return measured / PROBE_COPY_BANDWIDTH if measured else 1.0


def bandwidth_at(in_flight_bytes: float, curve=PROBE_BANDWIDTH, scale: float = 1.0) -> float:
    """Bytes per us the HBM delivers with ``in_flight_bytes`` requested (linear between the curve's points, flat
    past the last), times ``scale`` (the run's copy bandwidth against the probe's)."""
    mb = in_flight_bytes / 1e6
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if mb <= x1:
            return scale * 1e6 * (y0 + (y1 - y0) * (mb - x0) / (x1 - x0))
    return scale * 1e6 * curve[-1][1]


def fluid_timeline(schedule: Schedule, costs: dict[str, WaveCost], nbytes: list[float], *, bandwidth_scale: float = 1.0,
                   latency_us: float = 0.8, stages_in_flight: int | None = None, ring_bytes: int = 5 * STAGE_BYTES,
                   hop_us: float = 0.7, gap_us: float = 0.3, live_slots=None, dt_us: float = 0.05,
                   has_work=None, stage_us: float = 0.45, attention_stage_us: float = 0.9,
                   routed_descriptor_us: float = 0.5, groups: int = 1, storer_finish: float | None = None) -> Timed:
    """Runs the schedule through the model (see the module's docstring). ``live_slots(layer)``: routed slots in
    use (every slot if None); ``has_work(task)``: whether a task that waits only if it has work has any (an
    attention split past its request's keys does not wait and takes no time; default: bytes > 0). The consumers
    take a landed stage (32 KB) in at least ``stage_us`` (its wait, mma and release), an attention tile in
    ``attention_stage_us`` (scores, softmax, P V). A routed task's producer spends ``routed_descriptor_us`` after
    its routing wait completing the descriptor (the route words' round trip) before its bytes, and its
    consumers cannot start it before. The defaults are the values PERF_LOG #161 compared with session AE's
    measured A/Bs (``bandwidth_scale`` 1: the probe's 4.68 TB/s plateau).

    Two forms the kernel does not have, to weigh them before writing them (PERF_LOG #206): ``groups`` consumer groups
    that take an SM's tasks in turn (the kernel's one group of 8 warps: 1), each with its own phases, so one group's
    inputs phase and finish overlap another's stages; the ring stays in task order, so a group takes its task's bytes
    only after the task before it took all of its own, at ``stage_us`` / ``attention_stage_us`` (give a group's pace).
    ``storer_finish``: a task that streams bytes hands the body's rest (the finish) to the SM's storer warp, which
    takes ``storer_finish`` x the wave's finish and one task at a time, and signals after it; the consumers go on at
    the end of the stream (None: the consumers finish their own tasks, as the kernel's do)."""
    if groups < 1 or (storer_finish is not None and storer_finish < 0):
        raise ValueError(f"groups={groups}: at least 1; storer_finish={storer_finish}: None or >= 0")
    tasks, n_sms = schedule.tasks, len(schedule.sm_tasks)
    missing = {t.wave for t in tasks} - set(costs)
    if missing:
        raise ValueError(f"no costs for waves {sorted(missing)}")
    in_flight = (stages_in_flight or schedule.shape.stages_in_flight) * STAGE_BYTES
    worked = has_work or (lambda t: nbytes[t.index] > 0)
    dead = dead_tasks(schedule, live_slots)
    claimable = claim_waves(schedule)
    claimed = dict.fromkeys(claimable, 0)
    counts = [0] * len(schedule.barriers)
    done_at = [math.inf] * len(schedule.barriers)  # when each barrier completed
    targets = [b.target for b in schedule.barriers]
    last_signal = [0.0] * len(schedule.barriers)
    # when each barrier's last signaller finished its body (before its tail): a task that polls its inputs' own
    # words (Task.polls_inputs: the top-k under posted scores) sees them then, without the signals' tails
    written_at = [math.inf] * len(schedule.barriers)
    last_written = [0.0] * len(schedule.barriers)

    def signal(b: int, at: float, written: float) -> None:
        counts[b] += 1
        last_signal[b] = max(last_signal[b], at)
        last_written[b] = max(last_written[b], written)
        if counts[b] == targets[b]:
            done_at[b], written_at[b] = last_signal[b], last_written[b]

    for i in dead:  # the top-k makes up the dead slots' down tiles; nothing live waits on their up/gate tiles
        if tasks[i].signal != NO_BARRIER:
            signal(tasks[i].signal, 0.0, 0.0)

    lists = [list(lst) for lst in schedule.sm_tasks]
    resolved = [[tasks[i].claim == NO_BARRIER for i in lst] for lst in lists]
    skipped = [[False] * len(lst) for lst in lists]
    exhausted: list[set[int]] = [set() for _ in range(n_sms)]
    delivered = [[0.0] * len(lst) for lst in lists]
    ppc, cpc = [0] * n_sms, [0] * n_sms
    ring = [0.0] * n_sms  # bytes landed and not yet taken by the consumers
    published = [[0.0 if tasks[i].op not in ROUTED_OPS else math.inf for i in lst] for lst in lists]
    posted_at = [math.inf] * len(tasks)  # a top-k's posted words (posted routing): when its selection was done
    # per SM and consumer group: idle -> inputs -> stream -> finish -> idle; cpc: the SM's next place to start
    cstate = [["idle"] * groups for _ in range(n_sms)]
    ctimer = [[0.0] * groups for _ in range(n_sms)]
    ctask = [[0] * groups for _ in range(n_sms)]  # the place each group runs
    taken = [[0.0] * groups for _ in range(n_sms)]  # bytes of that place taken so far
    free_at = [[0.0] * groups for _ in range(n_sms)]
    started = [0] * n_sms  # tasks started on the SM: the next one goes to group started % groups
    head = [0] * n_sms  # the ring's head: the first place whose bytes are not all taken (skipping those with none)
    storer_free = [0.0] * n_sms
    start = [math.nan] * len(tasks)
    end = [math.nan] * len(tasks)
    need = [nbytes[i] for i in range(len(tasks))]
    remaining = sum(len(lst) for lst in lists)
    now, progress = 0.0, (remaining, 0.0)  # a deadlock: no task done for STALL_US of model time
    while remaining:
        if remaining != progress[0]:
            progress = (remaining, now)
        elif now - progress[1] > STALL_US:
            held = [f"SM {sm}: {cstate[sm]} before {tasks[lists[sm][cpc[sm]]].describe()}" for sm in range(n_sms)
                    if cpc[sm] < len(lists[sm])][:4]
            raise ValueError(f"the schedule did not finish in the fluid model: no task done for {STALL_US:.0f} us "
                             f"(a deadlock: see simulate.run); {'; '.join(held)}")
        # producers: settle claims and routing waits, then who streams and at what rate
        asks = []
        for sm in range(n_sms):
            lst = lists[sm]
            while ppc[sm] < len(lst):
                k = ppc[sm]
                if not resolved[sm][k]:  # a claiming place: its tile's number first, as the kernel's producer
                    t = tasks[lst[k]]
                    if t.claim in exhausted[sm]:  # an earlier claim of this wave drew a dead tile: no claim
                        skipped[sm][k] = resolved[sm][k] = True
                    else:
                        lst[k] = claimable[t.claim][claimed[t.claim]]
                        claimed[t.claim] += 1
                        resolved[sm][k] = True
                if skipped[sm][k]:
                    ppc[sm] += 1
                    continue
                t = tasks[lst[k]]
                if t.op in ROUTED_OPS and published[sm][k] == math.inf:
                    # the routing (and under posted routing the top-k's words) before a slot is known live or dead
                    if t.load_wait != NO_BARRIER and done_at[t.load_wait] + hop_us > now:
                        break
                    if t.load_post >= 0 and posted_at[t.load_post] + hop_us > now:
                        break
                    if lst[k] in dead:
                        skipped[sm][k] = True
                        if t.claim != NO_BARRIER:
                            exhausted[sm].add(t.claim)
                        ppc[sm] += 1
                        continue
                    published[sm][k] = now + routed_descriptor_us
                if published[sm][k] > now:
                    break  # completing the descriptor
                if delivered[sm][k] >= need[lst[k]]:
                    ppc[sm] += 1
                    continue
                room = ring_bytes - ring[sm]
                if room > 0:  # the bytes it keeps requested (at least one 4 KB request while any are left)
                    asks.append((sm, min(in_flight, room, max(need[lst[k]] - delivered[sm][k], 4096.0))))
                break
        total = sum(a for _, a in asks)
        # every request lands after latency_us at best, and the HBM serves what is in flight at its curve's rate
        served = min(total / latency_us, bandwidth_at(total, scale=bandwidth_scale)) if total else 0.0
        for sm, a in asks:
            k = ppc[sm]
            i = lists[sm][k]
            got = min(served * a / total * dt_us, need[i] - delivered[sm][k], ring_bytes - ring[sm])
            delivered[sm][k] += got
            ring[sm] += got
        # consumers: a task starts on the unit whose turn it is (in list order, alternating over the groups); a unit
        # takes its task's bytes only once every earlier task of the SM has taken its own (the ring is in task order)
        for sm in range(n_sms):
            lst = lists[sm]
            while cpc[sm] < len(lst) and skipped[sm][cpc[sm]]:
                cpc[sm] += 1
                remaining -= 1
            k = cpc[sm]
            g = started[sm] % groups
            if k < len(lst) and resolved[sm][k] and cstate[sm][g] == "idle":
                i = lst[k]
                t = tasks[i]
                waits = t.waits if (not t.waits_only_if_work or worked(t)) else ()
                if t.op in ROUTED_OPS and t.load_wait != NO_BARRIER:
                    waits = tuple(waits) + (t.load_wait,)
                if (free_at[sm][g] <= now and published[sm][k] <= now
                        and not any((written_at[b] if t.polls_inputs else done_at[b]) + hop_us > now for b in waits)):
                    start[i] = now
                    started[sm] += 1
                    cpc[sm] += 1
                    if t.waits_only_if_work and not worked(t):
                        end[i] = now
                        free_at[sm][g] = now + gap_us
                        if t.signal != NO_BARRIER:
                            signal(t.signal, now + costs[t.wave].tail_us, now)
                        remaining -= 1
                    else:
                        cstate[sm][g], ctimer[sm][g], ctask[sm][g] = "inputs", now + costs[t.wave].inputs_us, k
            for g in range(groups):
                if cstate[sm][g] == "idle":
                    continue
                k = ctask[sm][g]
                i = lst[k]
                t = tasks[i]
                c = costs[t.wave]
                if cstate[sm][g] == "inputs" and ctimer[sm][g] <= now:
                    cstate[sm][g], ctimer[sm][g] = "stream", now + (c.stage_work_us if need[i] == 0 else 0.0)
                    taken[sm][g] = 0.0
                if cstate[sm][g] == "stream" and need[i] > 0:
                    while head[sm] < k and (skipped[sm][head[sm]] or need[lst[head[sm]]] == 0):
                        head[sm] += 1
                    if head[sm] == k:  # the landed stages, at the consumers' own pace at most
                        per = attention_stage_us if t.op == Op.ATTN_PARTIAL else stage_us
                        got = min(delivered[sm][k] - taken[sm][g], STAGE_BYTES / per * dt_us)
                        taken[sm][g] += got
                        ring[sm] -= got
                if cstate[sm][g] == "stream" and taken[sm][g] >= need[i] and ctimer[sm][g] <= now:
                    if need[i] > 0:
                        head[sm] = k + 1  # only the head's task takes bytes
                    posted_at[i] = now  # a top-k's words are posted once its selection is done
                    if storer_finish is not None and need[i] > 0:
                        # the storer takes the body's rest, one task at a time; the unit goes on
                        storer_free[sm] = max(storer_free[sm], now) + c.finish_us * storer_finish
                        end[i] = storer_free[sm]
                        if t.signal != NO_BARRIER:
                            signal(t.signal, end[i] + c.tail_us, end[i])
                        free_at[sm][g] = now + gap_us
                        cstate[sm][g] = "idle"
                        remaining -= 1
                        continue
                    cstate[sm][g], ctimer[sm][g] = "finish", now + c.finish_us
                if cstate[sm][g] == "finish" and ctimer[sm][g] <= now:
                    end[i] = now
                    free_at[sm][g] = now + gap_us
                    if t.signal != NO_BARRIER:
                        signal(t.signal, now + c.tail_us, now)
                    cstate[sm][g] = "idle"
                    remaining -= 1
        now += dt_us
    sm_lists = [[i for k, i in enumerate(lst) if not skipped[sm][k]] for sm, lst in enumerate(lists)]
    return Timed(start, end, sm_lists)


__all__ = ["PROBE_BANDWIDTH", "STAGE_BYTES", "WaveCost", "bandwidth_at", "costs_from_profile", "fluid_timeline",
           "task_bytes"]

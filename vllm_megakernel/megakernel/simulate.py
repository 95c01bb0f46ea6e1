"""CPU interpreter of a megakernel schedule: the first test of any schedule change.

Three checks, none of which needs a GPU:

- ``run``: executes the per-SM task lists the way the kernel does -- each SM takes its tasks in order, a
  task starts only when every barrier it waits on has reached its target, finishing a task adds one to its
  signal barrier -- with a chosen interleaving of SMs. It raises :class:`Deadlock` when no SM can move
  (naming each stuck task, barrier, expected and seen counts), :class:`BarrierOverflow` when a barrier is
  signalled past its target, and :class:`BarrierCountError` when a barrier ends off its target. The
  kernel's producer warp also waits on a barrier before issuing some loads (``Task.load_wait``: expert
  weights after the layer's routing, the tile holding the new token after the layer's qkv); ``run`` checks
  that every such barrier is signalled only by lower-numbered tasks, which is what keeps a producer from
  deadlocking against its own consumers, and runs a producer per SM that publishes places at most the
  descriptor ring ahead, stops at those waits, and claims expert tasks from their waves' counters.
- ``check_races``: proves from the barrier graph alone that any two tasks touching the same logical
  region, at least one of them writing, are ordered (happens-before through program order and barriers).
  A missing dependency fails here even when one lucky interleaving would have produced the right numbers.
  It checks a step under a given routing too (dead slots' tasks skipped, the top-k signalling for them),
  and the expert buffers' rows, which move between slots from one MoE layer to the next.
- ``Numerics``: executes each opcode with torch ops on a workspace laid out as the kernel's
  (:func:`layout.workspace_spec`), so that a whole step run through the schedule can be compared with
  :func:`vllm_megakernel.reference.decode_step`, and one wave can be compared with the kernel's own output.
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from vllm_megakernel.megakernel import layout
from vllm_megakernel.megakernel.abi import KERNEL, NO_BARRIER, ROUTED_OPS, Op, pack_route_post, unpack_route_post
from vllm_megakernel.megakernel.runtime import routed_experts, workspace_dtype
from vllm_megakernel.megakernel.schedule import POSTED_ROUTES, Schedule, Task
from vllm_megakernel.reference import DecodeInputs, Weights, rms_norm, route, uniform_experts


DESC_SLOTS = KERNEL["desc_slots"]  # how far a producer may run ahead of its consumers, in places


class ScheduleError(RuntimeError):
    pass


class Deadlock(ScheduleError):
    pass


class BarrierOverflow(ScheduleError):
    pass


class BarrierCountError(ScheduleError):
    pass


class RaceError(ScheduleError):
    pass


def run(schedule: Schedule, execute: Callable[[Task], None] | None = None, order: str = "round_robin",
        seed: int = 0, placed: list[list[int]] | None = None,
        live_slots: Callable[[int], int] | None = None, claims_taken: dict[int, int] | None = None) -> list[int]:
    """Executes the schedule; returns task indices in the order they ran.

    ``order``: ``"round_robin"`` advances SMs in turn; ``"random"`` picks a random runnable SM each time
    (a different legal interleaving per seed); ``"reverse"`` prefers the highest-numbered runnable SM.

    Each SM has a producer too, as in the kernel: it takes the SM's places in order, at most
    ``DESC_SLOTS`` ahead of the consumers (the descriptor ring), and cannot get past a place whose
    ``load_wait`` barrier is incomplete (a routed expert task, abi.ROUTED_OPS: before publishing it, since
    it completes the descriptor from the routing; any other: after publishing it, while it loads). A
    consumer runs a place only once the producer has published it. A claiming expert task
    (``Task.claim``) takes the next task of its wave from the wave's counter when the producer reaches
    it, before the routing wait, and that task runs there (its waits, its signal). How far ahead producers run is the
    order's choice -- as far as they can (``round_robin``), only to the consumer's next place
    (``reverse``), a random distance each time (``random``) -- each a legal behaviour of the kernel's
    producers. ``placed``, when given, receives each SM's list as it ran, claimed tasks in their places.

    ``live_slots``, when given, is the routing: a layer's number of live expert slots, asked once the
    layer's routing is complete. A routed task of a dead slot is then skipped as the kernel's producer
    skips it (abi.py's routed descriptors: never published, never run, no signal), and each top-k adds
    its dead slots' down tiles to its ``down_barrier``. A producer whose claim handed it a dead slot's tile
    skips its later places of that wave without claiming (csrc/ops/moe.cuh's RoutingSeen: the counter
    only hands out later, so dead, tiles), so some dead tiles are never claimed. Without ``live_slots``
    every slot is live (a routing that fills every slot), and the top-k adds nothing. ``claims_taken``,
    when given, receives each claim counter's number of claims.
    """
    _check_producer_waits(schedule)
    claimable: dict[int, list[int]] = defaultdict(list)  # counter -> its wave's tasks, in claim order
    for t in schedule.tasks:
        if t.claim != NO_BARRIER:
            claimable[t.claim].append(t.index)
    claimed = dict.fromkeys(claimable, 0)
    counts = [0] * len(schedule.barriers)
    targets = [b.target for b in schedule.barriers]
    lists = [list(lst) for lst in schedule.sm_tasks]
    n = len(lists)
    pcs = [0] * n  # the consumers' next place
    published = [0] * n  # places the producer has published (and claimed, where claiming)
    producer_blocked = [NO_BARRIER] * n  # the load_wait barrier a producer last stopped on
    post_blocked = [-1] * n  # the task whose posted words a producer polls now (Task.load_post); -1: none
    finished: set[int] = set()  # tasks that ran: their posted words are stored
    producers_polling: dict[int, list[int]] = defaultdict(list)  # task -> SMs whose producer polls its posts
    claimed_place = [-1] * n  # the last place each producer took a claim for
    exhausted: list[set[int]] = [set() for _ in range(n)]  # counters that handed the producer a dead tile
    made_up = {t.fields["down_barrier"] for t in schedule.tasks
               if t.op == Op.ROUTER_TOPK and t.fields["down_barrier"] != NO_BARRIER}
    unsignalled = [0] * len(schedule.barriers)  # skipped tasks' signals nothing makes up
    rng = random.Random(seed)
    done: list[int] = []
    remaining = sum(len(t) for t in lists)
    skipped = 0
    waiting: dict[int, list[int]] = defaultdict(list)  # barrier -> SMs whose next task waits on it
    producers_waiting: dict[int, list[int]] = defaultdict(list)  # barrier -> SMs whose producer waits on it
    ready: set[int] = set()
    cursor = 0

    def complete(b: int) -> bool:
        return b == NO_BARRIER or counts[b] >= targets[b]

    def advance(sm: int) -> None:
        """The producer takes places until its lookahead or an incomplete load_wait stops it."""
        nonlocal skipped
        if not complete(producer_blocked[sm]) or post_blocked[sm] != -1:
            return
        reach = DESC_SLOTS if order == "round_robin" else 1 if order == "reverse" else rng.randint(1, DESC_SLOTS)
        lst = lists[sm]
        while published[sm] < min(len(lst), pcs[sm] + reach):
            place = published[sm]
            task = schedule.tasks[lst[place]]
            if task.claim in exhausted[sm]:  # every later tile of the wave is dead: skipped unclaimed
                lst.pop(place)
                skipped += 1
                continue
            if task.claim != NO_BARRIER and claimed_place[sm] != place:  # claimed on reaching the place
                lst[place] = claimable[task.claim][claimed[task.claim]]
                claimed[task.claim] += 1
                claimed_place[sm] = place
            task = schedule.tasks[lst[place]]  # the tile it claimed (its slot, its signal)
            routed = task.op in ROUTED_OPS  # its descriptor is completed from the routing before publishing
            if routed and not complete(task.load_wait):
                producer_blocked[sm] = task.load_wait
                producers_waiting[task.load_wait].append(sm)
                return
            # posted routing: then it polls the top-k's words (data and flag in one store: nothing to count)
            if routed and task.load_post != -1 and task.load_post not in finished:
                post_blocked[sm] = task.load_post
                producers_polling[task.load_post].append(sm)
                return
            if routed and live_slots is not None and task.fields["slot"] >= live_slots(task.layer):
                lst.pop(place)  # a dead slot's task: not published; the next place moves up
                claimed_place[sm] = -1
                skipped += 1
                if task.claim != NO_BARRIER:
                    exhausted[sm].add(task.claim)
                if task.signal != NO_BARRIER and task.signal not in made_up:
                    unsignalled[task.signal] += 1
                continue
            published[sm] += 1
            if not complete(task.load_wait):  # published; the producer is stuck in its loads
                producer_blocked[sm] = task.load_wait
                producers_waiting[task.load_wait].append(sm)
                return

    def park(sm: int) -> None:
        """Puts an SM whose next place is published into ``ready`` or under the first barrier it still
        needs; one whose next place is not yet published waits for its producer."""
        if pcs[sm] >= len(lists[sm]):
            return
        advance(sm)
        if published[sm] <= pcs[sm]:  # the consumers wait for their producer
            return
        task = schedule.tasks[lists[sm][pcs[sm]]]
        for b in task.waits:
            if counts[b] < targets[b]:
                waiting[b].append(sm)
                return
        ready.add(sm)

    def signal(task: Task, b: int, k: int) -> None:
        counts[b] += k
        if counts[b] > targets[b]:
            raise BarrierOverflow(
                f"{task.describe()} signalled {schedule.barrier_name(b)} to {counts[b]}, past its target {targets[b]}"
            )
        if counts[b] == targets[b]:
            for other in producers_waiting.pop(b, []):
                if published[other] <= pcs[other]:  # its consumers were waiting for it
                    park(other)
                else:
                    advance(other)
            for other in waiting.pop(b, []):
                park(other)

    for sm in range(n):
        park(sm)
    while remaining - skipped:
        if not ready:
            raise Deadlock(_deadlock_report(schedule, lists, pcs, counts, published, producer_blocked, post_blocked))
        if order == "random":
            sm = rng.choice(sorted(ready))
        elif order == "reverse":
            sm = max(ready)
        else:
            sm = min(ready, key=lambda s: (s - cursor) % n)
            cursor = sm + 1
        ready.discard(sm)
        task = schedule.tasks[lists[sm][pcs[sm]]]
        if execute is not None:
            execute(task)
        if task.signal != NO_BARRIER:
            signal(task, task.signal, 1)
        if task.op == Op.ROUTER_TOPK and live_slots is not None and task.fields["down_barrier"] != NO_BARRIER:
            dead = schedule.num_slots - live_slots(task.layer)
            if dead > 0:  # the dead slots' down tiles, which their producers will skip
                signal(task, task.fields["down_barrier"], dead * task.fields["down_tiles"])
        pcs[sm] += 1
        remaining -= 1
        done.append(task.index)
        finished.add(task.index)
        for other in producers_polling.pop(task.index, []):  # its posted words are in: they read them
            post_blocked[other] = -1
            if published[other] <= pcs[other]:
                park(other)
            else:
                advance(other)
        park(sm)
    for counter, wave in claimable.items():  # tiles no place claimed: dead ones only, unsignalled
        for i in wave[claimed[counter]:]:
            task = schedule.tasks[i]
            if live_slots is None or task.fields["slot"] < live_slots(task.layer):
                raise BarrierCountError(f"{task.describe()} was never claimed, and its slot is live")
            if task.signal != NO_BARRIER and task.signal not in made_up:
                unsignalled[task.signal] += 1
    wrong = [(schedule.barrier_name(b), counts[b], bar.target) for b, bar in enumerate(schedule.barriers)
             if counts[b] + unsignalled[b] != bar.target]
    if wrong:
        raise BarrierCountError("barriers off target after the step (name, seen, target): " + repr(wrong[:10]))
    if placed is not None:
        placed[:] = lists
    if claims_taken is not None:
        claims_taken.update(claimed)
    return done


def claims_resolved(schedule: Schedule, order: str = "round_robin", seed: int = 0,
                    live_slots: Callable[[int], int] | None = None) -> Schedule:
    """The schedule as one run of it placed its claiming tasks: each task on the SM and at the place where
    it ran, none claiming. The barrier-graph checks (``check_races``) run on this; every order of claims
    is a different such schedule. With ``live_slots`` (``run``'s routing) the dead slots' tasks, which ran
    nowhere, go back at the end of their own SM's list, where a run with the same ``live_slots`` skips them
    again and accounts for their signals."""
    if all(t.claim == NO_BARRIER for t in schedule.tasks):
        return schedule
    placed: list[list[int]] = []
    run(schedule, order=order, seed=seed, placed=placed, live_slots=live_slots)
    tasks = [dataclasses.replace(t, fields={**t.fields, "claim": NO_BARRIER}) if t.claim != NO_BARRIER else t
             for t in schedule.tasks]
    for sm, lst in enumerate(placed):
        for i in lst:
            tasks[i].sm = sm
    ran = {i for lst in placed for i in lst}
    listed = {i for lst in schedule.sm_tasks for i in lst}
    for t in schedule.tasks:
        if t.index not in ran and t.index in listed:
            placed[t.sm].append(t.index)
    return Schedule(schedule.dims, schedule.shape, schedule.tiles, tasks, schedule.barriers, placed)


def _check_producer_waits(schedule: Schedule) -> None:
    last_signaller = [-1] * len(schedule.barriers)
    for t in schedule.tasks:
        if t.signal != NO_BARRIER:
            last_signaller[t.signal] = max(last_signaller[t.signal], t.index)
    for t in schedule.tasks:
        b = t.load_wait
        if b != NO_BARRIER:
            if last_signaller[b] >= t.index:
                raise Deadlock(f"the producer of {t.describe()} would wait on {schedule.barrier_name(b)}, which "
                               f"task {last_signaller[b]} (not earlier in the step) signals")
        if t.load_post >= t.index:
            raise Deadlock(f"the producer of {t.describe()} would poll the posted words of task {t.load_post}, "
                           f"which is not earlier in the step")


def _deadlock_report(schedule: Schedule, lists: list[list[int]], pcs: list[int], counts: list[int],
                     published: list[int], producer_blocked: list[int], post_blocked: list[int]) -> str:
    lines = []
    for sm, pc in enumerate(pcs):
        if pc >= len(lists[sm]):
            continue
        task = schedule.tasks[lists[sm][pc]]
        if published[sm] <= pc and post_blocked[sm] != -1:
            lines.append(f"the producer of SM {sm} polls the posted words of task {post_blocked[sm]} before "
                         f"publishing {task.describe()}")
            continue
        if published[sm] <= pc:
            b = producer_blocked[sm]
            lines.append(f"the producer of SM {sm} waits on {schedule.barrier_name(b)} before publishing "
                         f"{task.describe()}: expected {schedule.barriers[b].target}, seen {counts[b]}")
            continue
        for b in task.waits:
            if counts[b] < schedule.barriers[b].target:
                lines.append(f"{task.describe()} waits on {schedule.barrier_name(b)}: "
                             f"expected {schedule.barriers[b].target}, seen {counts[b]}")
    return "deadlock: no SM can make progress\n  " + "\n  ".join(lines[:20])


class HappensBefore:
    """Vector clocks over the schedule: ``clock[t][s]`` is how many of SM s's tasks happen before task t's
    accesses (by program order and barriers; always a prefix of s's list). ``ordered(a, b)``: a happens
    before b.

    A task whose opcode waits only when it has work (``Task.waits_only_if_work``: the kernel skips the
    input waits of a task with nothing to do, and such a task touches nothing) orders its own accesses
    after its waits, but passes on to the tasks after it on its SM, and to the waiters on its signal, only
    what it knew before its waits: on a step where it has no work it never waited. So does a task that polls its
    inputs' own posted words instead of waiting (``Task.polls_inputs``): each poll orders the word it read and
    nothing else its writer wrote. (The writer's reads before it stored the word are ordered too, on the hardware,
    by the word's data dependency on them, which the clocks do not carry: a step whose every row is padding, so that
    nothing else waits on the routers, shows a race on the residual the routers read; vLLM runs no such step, its
    dummy steps too have a live row.) Except where all of a
    barrier's signallers are a layer's attention splits: a step has at least one live request (vLLM's dummy
    runs too: their sequence lengths are at least 1), whose split holding its newest token has work, so one
    of them waited, and the waiter knows at least what the least informed of them knew after its waits. Without that, every task after the attention
    wave would be ordered after the layer's QKV wave only through program order, which on more SMs than
    tasks a layer orders nothing (a false race between two layers' QKV tasks at 40 SMs)."""

    def __init__(self, schedule: Schedule, live_slots: Callable[[int], int] | None = None,
                 ran: list[int] | None = None):
        """``live_slots`` as in :func:`run`: the dead slots' tasks never run or signal, and each top-k signals
        its layer's down barrier in their place; ``ran``: that run's order, when the caller has it."""
        if ran is None:
            ran = run(schedule, live_slots=live_slots)
        executed = set(ran)
        n_sm = len(schedule.sm_tasks)
        self.sm = np.array([t.sm for t in schedule.tasks], dtype=np.int64)
        self.pos = np.zeros(len(schedule.tasks), dtype=np.int64)
        prev = [-1] * len(schedule.tasks)  # the task before it on its SM that ran (a skipped one knew nothing)
        for lst in schedule.sm_tasks:
            last = -1
            for i, t in enumerate(lst):
                self.pos[t] = i
                prev[t] = last
                if t in executed:
                    last = t
        signallers: dict[int, list[int]] = defaultdict(list)
        for t in schedule.tasks:
            if t.index not in executed:
                continue
            if t.signal != NO_BARRIER:
                signallers[t.signal].append(t.index)
            if (t.op == Op.ROUTER_TOPK and live_slots is not None and t.fields["down_barrier"] != NO_BARRIER
                    and live_slots(t.layer) < schedule.num_slots):  # it signals for the dead slots' down tiles
                signallers[t.fields["down_barrier"]].append(t.index)
        self.clock = np.zeros((len(schedule.tasks), n_sm), dtype=np.int32)
        passed = self.clock  # what a task passes on; a separate array only where it differs
        keeps_waits = [not (t.waits_only_if_work or t.polls_inputs) for t in schedule.tasks]
        if not all(keeps_waits):
            passed = np.zeros_like(self.clock)
        joins: dict[int, np.ndarray] = {}
        for i in ran:  # a topological order
            c = self.clock[i]
            p = prev[i]
            if p >= 0:
                np.maximum(c, passed[p], out=c)
                c[self.sm[p]] = max(c[self.sm[p]], self.pos[p] + 1)
            if passed is not self.clock:
                passed[i] = c
            for b in schedule.tasks[i].waits:
                if b not in joins:
                    j = np.zeros(n_sm, dtype=np.int32)
                    for u in signallers[b]:
                        np.maximum(j, passed[u], out=j)
                        j[self.sm[u]] = max(j[self.sm[u]], self.pos[u] + 1)
                    us = signallers[b]
                    # a layer's attention splits: one of them had work (the premise is theirs; another opcode
                    # that waits only if it has work would need its own)
                    if us and all(schedule.tasks[u].op == Op.ATTN_PARTIAL for u in us):
                        least = self.clock[us].min(axis=0)
                        np.maximum(j, least, out=j)
                    joins[b] = j
                np.maximum(c, joins[b], out=c)
            if passed is not self.clock and keeps_waits[i]:
                passed[i] = c

    def ordered(self, a: int, b: int) -> bool:
        return bool(self.clock[b, self.sm[a]] > self.pos[a])


def check_races(schedule: Schedule, order: str = "round_robin", seed: int = 0,
                live_slots: Callable[[int], int] | None = None) -> None:
    """Raises :class:`RaceError` naming two unordered tasks that touch one region, one of them writing.

    Per region, the accesses in a topological order must look like W R.. W R.. with every writer ordered
    after the previous writer and every reader between two writers ordered after the first and before the
    second; by transitivity that orders every conflicting pair. Claiming tasks are checked where one run
    (``order``, ``seed``) placed them (:func:`claims_resolved`).

    ``live_slots`` checks the step under that routing (:func:`run`'s): a dead slot's expert tasks touch
    nothing and order nothing, and the top-k's signal stands in for their down tiles' -- an ordering that
    held only through a skipped task fails here. Without it every slot is live. It is asked many times per
    layer, so it must depend on the layer alone.

    The expert buffers' rows belong to a token's k-th choice, not to a slot (``act`` and ``eout`` are
    [batch x top_k, ...]): slot s of one MoE layer and slot s' of the next can hold the same rows, which their
    region keys (by slot) do not say. So every expert task's access to them in one MoE layer is also checked
    against every conflicting one in the next (:func:`_check_expert_rows_across_layers`)."""
    schedule = claims_resolved(schedule, order, seed, live_slots)
    ran = run(schedule, live_slots=live_slots)  # a topological order (raises on deadlock)
    hb = HappensBefore(schedule, live_slots, ran)
    topo = {t: k for k, t in enumerate(ran)}
    writes: dict[tuple, list[int]] = defaultdict(list)
    reads_by_prefix: dict[tuple, list[int]] = defaultdict(list)
    for t in schedule.tasks:
        if t.index not in topo:  # a dead slot's task: skipped, it touches nothing
            continue
        for r in t.writes:
            writes[r].append(t.index)
        for r in t.reads:
            reads_by_prefix[r].append(t.index)
    for key, writers in writes.items():
        readers = [i for n in range(1, len(key) + 1) for i in reads_by_prefix.get(key[:n], ())]
        if key[0] == POSTED_ROUTES:  # a flag in the data, no barrier: read only by the producers that poll it
            _check_posted(schedule, key, writers, readers)
            continue
        events = sorted([(topo[i], i, True) for i in writers] + [(topo[i], i, False) for i in readers])
        last_writer = None
        pending: list[int] = []  # readers since the last writer
        for _, i, is_write in events:
            if is_write:
                if last_writer is not None and last_writer != i and not hb.ordered(last_writer, i):
                    _race(schedule, key, i, last_writer)
                for r in pending:
                    if r != i and not hb.ordered(r, i):
                        _race(schedule, key, i, r)
                last_writer, pending = i, []
            else:
                if last_writer is not None and last_writer != i and not hb.ordered(last_writer, i):
                    _race(schedule, key, last_writer, i)
                pending.append(i)
    _check_expert_rows_across_layers(schedule, hb, ran)


def _check_posted(schedule: Schedule, key: tuple, writers: list[int], readers: list[int]) -> None:
    """Posted words (StepShape.posted_routing) are written once a step, by one task, each in one store that
    carries its own flag, and read only by producers that poll them until the flag is set (``Task.load_post``):
    such a read needs no barrier edge. Another writer, or a reader that does not poll its writer, is a race."""
    if len(writers) != 1:
        raise RaceError(f"{key} is written by {len(writers)} tasks; posted words have one writer a step")
    for r in readers:
        if schedule.tasks[r].load_post != writers[0]:
            raise RaceError(f"{schedule.tasks[r].describe()} reads {key} without polling "
                            f"{schedule.tasks[writers[0]].describe()}, which posts them")


EXPERT_ROW_BUFFERS = ("act", "eout")  # rows r * top_k + k, held by whichever slot routes them that layer
EXPERT_OPS = frozenset({Op.MOE_UPGATE, Op.MOE_DOWN})


def _check_expert_rows_across_layers(schedule: Schedule, hb: HappensBefore, ran: list[int]) -> None:
    """For each expert row buffer: every access by an expert task of one MoE layer happens before every
    conflicting access (one of the two a write) by an expert task of the next MoE layer that touches it.
    Through consecutive layers that orders any two layers. Other readers (the MoE combine, a norm that sums
    the expert outputs) read the whole buffer under a prefix key, which the per-region check already
    orders against every slot's writer."""
    for name in EXPERT_ROW_BUFFERS:
        access: dict[int, list[int]] = defaultdict(list)  # layer -> its expert tasks touching the buffer
        write: dict[int, list[int]] = defaultdict(list)
        for i in ran:
            t = schedule.tasks[i]
            if t.op not in EXPERT_OPS:
                continue
            if any(r[0] == name for r in t.writes):
                write[t.layer].append(i)
                access[t.layer].append(i)
            elif any(r[0] == name for r in t.reads):
                access[t.layer].append(i)
        layers = sorted(access)
        for before, after in zip(layers, layers[1:]):
            _all_ordered(schedule, hb, name, access[before], write[after])
            _all_ordered(schedule, hb, name, write[before], access[after])


def _all_ordered(schedule: Schedule, hb: HappensBefore, name: str, first: list[int], then: list[int]) -> None:
    """Every task of ``first`` happens before every task of ``then``, else a RaceError on one such pair."""
    if not first or not then:
        return
    a = np.asarray(first)
    b = np.asarray(then)
    earliest = hb.clock[b].min(axis=0)  # per SM, the prefix of its list that every task of ``then`` has seen
    late = a[earliest[hb.sm[a]] <= hb.pos[a]]
    if len(late):
        i = int(late[0])
        j = next(int(k) for k in b if not hb.ordered(i, int(k)))
        ti, tj = schedule.tasks[i], schedule.tasks[j]
        raise RaceError(f"{ti.describe()} and {tj.describe()} touch {name} unordered: the next MoE layer's slots "
                        "can hold the same rows, one of the two writes them")


def _race(schedule: Schedule, key: tuple, writer: int, other: int) -> None:
    tw, to = schedule.tasks[writer], schedule.tasks[other]
    raise RaceError(f"{tw.describe()} writes {key} unordered with {to.describe()}")


class Numerics:
    """Executes opcodes with torch ops on a workspace laid out as the kernel's will be."""

    def __init__(self, schedule: Schedule, weights: Weights, inputs: DecodeInputs, uniform_routing: bool = False):
        self.s, self.dims, self.w, self.inp = schedule, schedule.dims, weights, inputs
        self.uniform_routing = uniform_routing  # the step table's uniform_routing (reference.uniform_experts)
        dt, dev = weights.embed.dtype, weights.embed.device
        self.group = self.dims.num_heads // self.dims.num_kv_heads
        self.spec = layout.workspace_spec(self.dims, schedule.shape.batch, schedule.shape.attn_splits,
                                          *weights.intermediates())
        for name in self._buffers():
            shape, kind = self.spec[name]
            # unwritten workspace must never be read: NaN shows up wherever it is
            setattr(self, name, torch.full(shape, float("nan"), dtype=workspace_dtype(kind, dt), device=dev))
        self.slot_expert: list[int] = []
        self.slot_rows: list[list[int]] = []
        self.layer_active: dict[int, int] = {}  # each routed layer's slot count (the route buffer keeps them)
        self.live = inputs.seq_lens > 0
        # local routing (StepShape.local_routing): each layer's choice as the producers make it from its scores
        self._local: dict[int, tuple[torch.Tensor, list[int], list[list[int]]]] = {}
        # posted routing (StepShape.posted_routing): each layer's posted words as the top-k stores them
        # (abi.pack_route_post), its routed slot count first; the expert tasks decode their slot's
        self.posts: dict[int, list[int]] = {}

    # -- the kernel's workspace: every buffer is a flat prefix laid out for this schedule's batch and splits;
    # the route buffer is kept as the expert list it encodes (slot_expert, slot_rows)
    def _buffers(self) -> list[str]:
        return [name for name in self.spec if name != "route"]

    def load_workspace(self, ws: dict[str, torch.Tensor]) -> None:
        """Adopts the state of a kernel workspace, e.g. after the kernel ran a truncated schedule, so the
        next wave can be executed here with torch ops on exactly the kernel's inputs."""
        for name in self._buffers():
            dst = getattr(self, name)
            dst.copy_(ws[name].reshape(-1)[: dst.numel()].view(dst.shape))
        self._local.clear()
        route = ws["route"].tolist()
        off, B = layout.route_offsets(self.dims, self.s.shape.batch), self.s.shape.batch
        active = route[0]
        self.slot_expert = route[off["expert"]:off["expert"] + active]
        counts = route[off["count"]:off["count"] + active]
        base = off["rows"]
        self.slot_rows = [route[base + s * B:base + s * B + counts[s]] for s in range(active)]
        self.layer_active = routed_experts(ws, self.dims, B)
        # Posted routing: the words live in the step's barrier array, not here, but the top-k posts the work list it
        # also writes to the route buffer (ops/router.cuh). The expert tasks a resumed step runs are those of the
        # layer whose top-k wrote the route buffer last, or of later layers, whose top-k runs after the resume and
        # posts again: so every MoE layer's words are the route buffer's list.
        self.posts = {}
        if self.s.shape.posted_routing:
            words = [active] + [pack_route_post(e, rows) for e, rows in zip(self.slot_expert, self.slot_rows)]
            self.posts = {layer: list(words) for layer in self.layer_active}

    def store_workspace(self, ws: dict[str, torch.Tensor]) -> None:
        """The inverse of :meth:`load_workspace`: writes this state in the kernel's layout."""
        for name in self._buffers():
            src = getattr(self, name)
            ws[name].reshape(-1)[: src.numel()].copy_(src.reshape(-1))
        off, B = layout.route_offsets(self.dims, self.s.shape.batch), self.s.shape.batch
        route = ws["route"]
        route[0] = len(self.slot_expert)
        for s, (e, rows) in enumerate(zip(self.slot_expert, self.slot_rows)):
            route[off["expert"] + s] = e
            route[off["count"] + s] = len(rows)
            base = off["rows"] + s * B
            route[base:base + len(rows)] = torch.tensor(rows, dtype=route.dtype)
        for layer, n in self.layer_active.items():
            route[off["layer_active"] + layer] = n

    def __call__(self, task: Task) -> None:
        fields = {k: v for k, v in task.fields.items() if k != "claim"}  # where the task came from, not what it does
        getattr(self, task.op.name.lower())(task.layer, **fields)

    # -- the residual stream and its norm
    def _residual(self, layer: int, moe: int = 0, rows: slice = slice(None)) -> torch.Tensor:
        """x_l (of ``rows``): the embedding on layer 0, else (x + attn) + mlp of the previous layer, in the
        order vLLM adds (bf16 rounding after each add); ``moe``: that mlp summed here from the expert outputs
        (a NORM task with the previous layer's MoE combine folded in), not read from the mlp buffer."""
        if layer == 0:
            return self.w.embed[self.inp.input_ids.long()][rows]
        pp = (layer - 1) % 2
        return self.x[pp, rows] + self.o[pp, rows] + (self._combined(rows) if moe else self.mlp[pp, rows])

    def _combined(self, rows: slice = slice(None), cols: slice = slice(None)) -> torch.Tensor:
        """The MoE combine of ``rows``: sum_k topk_w[r, k] * eout[r * K + k] in fp32, rounded once; zero for
        a padding row (not routed)."""
        K = self.dims.top_k
        width = self.eout[0, cols].numel()
        batch_rows = range(self.mlp.shape[1])[rows]
        acc = torch.zeros((len(batch_rows), width), dtype=torch.float32, device=self.mlp.device)
        for i, r in enumerate(batch_rows):
            if self.live[r]:
                for k in range(K):
                    acc[i] += self.topk_w[r, k] * self.eout[r * K + k, cols].float()
        return acc.to(self.mlp.dtype)

    @staticmethod
    def _task_rows(batch0: int, batch_rows: int) -> slice:
        """A split task's batch rows (QKV_ROPE, O_PROJ): [batch0, batch0 + batch_rows), every row for 0."""
        return slice(batch0, batch0 + batch_rows) if batch_rows else slice(None)

    def _normed(self, layer: int, fold: int) -> torch.Tensor:
        if not fold:
            return self.hn
        return rms_norm(self._residual(layer), self.w.layers[layer].norm, self.dims.eps)

    def norm(self, layer: int, row0: int, rows: int, final: int, moe: int, row_warps: int) -> None:
        # the kernel's two forms (csrc NormOp): a warp a row for up to 8 rows, or 8 warps on one row (the only
        # form with moe); anything else it would run wrong, not refuse
        w = layout.CONSUMER_WARPS
        if row_warps not in (1, w) or rows > w or (row_warps == w and rows > 1) or (moe and row_warps != w):
            raise ValueError(f"NORM layer {layer}: rows={rows}, row_warps={row_warps}, moe={moe} has no kernel form")
        r = slice(row0, row0 + rows)
        x = self._residual(layer, moe, r)
        self.x[layer % 2, r] = x
        if final:
            out = rms_norm(x, self.w.final_norm, self.dims.eps)
            self.out[r] = torch.where(self.live[r, None], out, torch.zeros_like(out))
        else:
            self.hn[r] = rms_norm(x, self.w.layers[layer].norm, self.dims.eps)

    # -- attention
    def qkv_rope(self, layer: int, row0: int, rows: int, norm: int, write_x: int, batch0: int,
                 batch_rows: int) -> None:
        dims, d = self.dims, self.dims.head_dim
        if write_x:
            self.x[layer % 2] = self._residual(layer)
        if batch_rows and norm:
            raise ValueError(f"QKV_ROPE layer {layer}: a batch-row slice with the norm folded in has no kernel form")
        bs_ = self._task_rows(batch0, batch_rows)
        y = self._normed(layer, norm)[bs_] @ self.w.layers[layer].qkv[row0:row0 + rows].t()  # [rows of bs_, rows]
        n = torch.arange(row0, row0 + rows, device=y.device)
        hq, hkv = dims.num_heads, dims.num_kv_heads
        if dims.rope[layer]:  # interleaved pairs (2i, 2i+1) of each q and k head turn by position * theta^(-2i/D)
            i = (n % d) // 2
            inv_freq = 1.0 / (dims.rope_theta ** ((2 * i).to(torch.float32) / d))
            ang = self.inp.positions[bs_].to(torch.float32)[:, None] * inv_freq[None, :]
            yf = y.float()
            even, odd = yf[:, 0::2], yf[:, 1::2]
            c, s = ang.cos()[:, 0::2], ang.sin()[:, 0::2]
            rot = torch.stack([even * c - odd * s, even * s + odd * c], dim=-1).flatten(1)
            turned = (n // d < hq + hkv)[None, :]
            y = torch.where(turned, rot.to(y.dtype), y)
        cache = self.inp.kv_caches[layer]
        slots = self.inp.groups[self.inp.layer_group[layer]].slot_mapping[bs_].tolist()
        bs = cache.shape[2]
        for j, row in enumerate(range(row0, row0 + rows)):
            head, dd = divmod(row, d)
            if head < hq:
                self.q[bs_, head, dd] = y[:, j]
                continue
            kv, g = (0, head - hq) if head < hq + hkv else (1, head - hq - hkv)
            for r, slot in enumerate(slots):
                if slot >= 0:
                    cache[slot // bs, kv, slot % bs, g, dd] = y[r, j]

    def _splits(self, layer: int, request: int) -> tuple[int, int | None, int, int, int]:
        """(seq_len, window, first tile, tiles per split, splits in use) of a request on a layer."""
        seq_len = int(self.inp.seq_lens[request])
        window = self.dims.sliding_window if self.dims.sliding[layer] else None
        shape = self.s.shape
        return (seq_len, window, *layout.attn_split_tiles(seq_len, window, shape.attn_splits, shape.attn_min_tiles,
                                                          shape.attn_live_splits, shape.attn_max_tiles))

    def attn_partial(self, layer: int, request: int, split: int) -> None:
        seq_len, window, first, per, used = self._splits(layer, request)
        if split >= used:  # past the end of this sequence (or a padding row): nothing to attend, nothing written
            return
        start, _ = layout.visible_range(seq_len, window)
        lo = max(start, (first + split * per) * layout.ATTN_TILE)
        hi = min(seq_len, (first + (split + 1) * per) * layout.ATTN_TILE)
        cache = self.inp.kv_caches[layer]
        table = self.inp.groups[self.inp.layer_group[layer]].block_table[request]
        bs = cache.shape[2]
        pos = torch.arange(lo, hi, device=cache.device)
        blocks, offs = table[pos // bs].long(), pos % bs
        k = cache[blocks, 0, offs].float()  # [T, Hkv, D]
        v = cache[blocks, 1, offs].float()
        q = self.q[request].float().view(self.dims.num_kv_heads, self.group, -1)  # [Hkv, G, D]
        scores = torch.einsum("kgd,tkd->kgt", q, k) * self.dims.head_dim ** -0.5
        m = scores.max(-1, keepdim=True).values
        p = (scores - m).exp()
        denom = p.sum(-1, keepdim=True)
        out = torch.einsum("kgt,tkd->kgd", p, v) / denom
        self.opart[request, split] = out.reshape(self.dims.num_heads, -1)
        self.lse[request, split] = (m + denom.log()).reshape(-1)

    def attn_combine(self, layer: int, request: int, head0: int, heads: int) -> None:
        d = self.dims.head_dim
        cols = slice(head0 * d, (head0 + heads) * d)
        used = self._splits(layer, request)[-1]
        if used == 0:  # padding row: no keys at all
            self.attn[request, cols] = 0.0
            return
        lse = self.lse[request, :used, head0:head0 + heads]  # [S, h]
        scale = (lse - lse.max(0).values).exp()
        out = (self.opart[request, :used, head0:head0 + heads] * scale[..., None]).sum(0) / scale.sum(0)[:, None]
        self.attn[request, cols] = out.reshape(-1).to(self.attn.dtype)

    def o_proj(self, layer: int, row0: int, rows: int, batch0: int, batch_rows: int) -> None:
        c = slice(row0, row0 + rows)
        bs_ = self._task_rows(batch0, batch_rows)
        self.o[layer % 2, bs_, c] = self.attn[bs_] @ self.w.layers[layer].o[c].t()

    # -- dense prefix MLP
    def dense_upgate(self, layer: int, col0: int, cols: int, norm: int) -> None:
        lw = self.w.layers[layer]
        inter = lw.down.shape[1]
        h = self._normed(layer, norm)
        gate = h @ lw.gate_up[col0:col0 + cols].t()
        up = h @ lw.gate_up[inter + col0:inter + col0 + cols].t()
        self.dact[:, col0:col0 + cols] = _silu_mul(gate, up)

    def dense_down(self, layer: int, row0: int, rows: int) -> None:
        c = slice(row0, row0 + rows)
        self.mlp[layer % 2, :, c] = self.dact @ self.w.layers[layer].down[c].t()

    # -- MoE
    def router(self, layer: int, row0: int, rows: int, norm: int, write_hn: int) -> None:
        h = self._normed(layer, norm)
        if write_hn:
            self.hn[:] = h
        logits = h @ self.w.layers[layer].router[row0:row0 + rows].t()  # bf16, like vLLM's gate
        self.scores[layer, :, row0:row0 + rows] = logits.float().sigmoid()
        self._local.pop(layer, None)

    def _routing(self, layer: int) -> tuple[torch.Tensor, list[int], list[list[int]]]:
        """The layer's top-k weights [B, K] and expert work list (slot_expert, slot_rows) from its scores, as the
        top-k task and, with local routing, every expert task's producer compute them."""
        dims = self.dims
        if self.uniform_routing:
            experts = uniform_experts(layer, self.inp.positions, dims.top_k, dims.num_experts)
            weights = torch.ones(experts.shape, dtype=self.topk_w.dtype, device=self.topk_w.device)
        else:
            weights, experts = torch.sort(self.scores[layer], dim=-1, descending=True, stable=True)
            weights, experts = weights[:, :dims.top_k], experts[:, :dims.top_k]
            if dims.norm_topk_prob:
                weights = weights / weights.sum(-1, keepdim=True)
        rows: dict[int, list[int]] = defaultdict(list)
        for r in range(experts.shape[0]):
            if self.live[r]:  # padding rows route nowhere
                for k, e in enumerate(experts[r].tolist()):
                    rows[e].append(r * dims.top_k + k)
        slot_expert = sorted(rows)
        return weights, slot_expert, [rows[e] for e in slot_expert]

    def _work_list(self, layer: int) -> tuple[list[int], list[list[int]]]:
        """What an expert task of ``layer`` runs on: the top-k's work list (the route buffer), with posted
        routing the layer's posted words decoded, or with local routing its producer's own, from the layer's
        scores."""
        if self.s.shape.posted_routing:
            slots = [unpack_route_post(w) for w in self.posts[layer][1:1 + self.posts[layer][0]]]
            return [e for e, _ in slots], [rows for _, rows in slots]
        if not self.s.shape.local_routing:
            return self.slot_expert, self.slot_rows
        if layer not in self._local:
            self._local[layer] = self._routing(layer)
        return self._local[layer][1:]

    def live_slots(self, layer: int) -> int:
        """The layer's routed slot count as its expert tasks' producers learn it (simulate.run's
        ``live_slots``): the top-k's, or with local routing their own from the scores."""
        return len(self._work_list(layer)[0]) if self.s.shape.local_routing else self.layer_active[layer]

    def router_topk(self, layer: int, down_barrier: int, down_tiles: int) -> None:
        weights, self.slot_expert, self.slot_rows = self._routing(layer)
        self.topk_w[:] = weights
        self.layer_active[layer] = len(self.slot_expert)
        if self.s.shape.posted_routing:
            self.posts[layer] = [len(self.slot_expert)] + [pack_route_post(e, rows) for e, rows in
                                                          zip(self.slot_expert, self.slot_rows)]

    def moe_upgate(self, layer: int, slot: int, col0: int, cols: int) -> None:
        slot_expert, slot_rows = self._work_list(layer)
        if slot >= len(slot_expert):
            return  # a dead slot's task: the kernel's producer skips it; run here anyway, it changes nothing
        lw, K = self.w.layers[layer], self.dims.top_k
        inter = lw.w2.shape[2]
        e, rows = slot_expert[slot], slot_rows[slot]
        h = self.hn[[r // K for r in rows]]
        gate = h @ lw.w13[e, col0:col0 + cols].t()
        up = h @ lw.w13[e, inter + col0:inter + col0 + cols].t()
        self.act[rows, col0:col0 + cols] = _silu_mul(gate, up)

    def moe_down(self, layer: int, slot: int, row0: int, rows: int) -> None:
        slot_expert, slot_rows = self._work_list(layer)
        if slot >= len(slot_expert):
            return  # as in moe_upgate
        rows = min(rows, self.dims.hidden - row0)  # a slot's last tile is cut at hidden (csrc MoeDownOp::task_rows)
        e, token_rows = slot_expert[slot], slot_rows[slot]
        w2 = self.w.layers[layer].w2[e, row0:row0 + rows]
        self.eout[token_rows, row0:row0 + rows] = self.act[token_rows] @ w2.t()

    def moe_combine(self, layer: int, col0: int, cols: int) -> None:
        c = slice(col0, col0 + cols)
        self.mlp[layer % 2, :, c] = self._combined(cols=c)


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up on the rounded GEMM outputs, in fp32, rounded once (vLLM's SiluAndMul)."""
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


def decode_step(schedule: Schedule, weights: Weights, inputs: DecodeInputs, order: str = "round_robin",
                seed: int = 0, uniform_routing: bool = False) -> torch.Tensor:
    """One decode step executed task by task through ``schedule``; returns the final hidden states."""
    if inputs.input_ids.shape[0] != schedule.shape.batch:
        raise ValueError(f"inputs have batch {inputs.input_ids.shape[0]}, schedule {schedule.shape.batch}")
    numerics = Numerics(schedule, weights, inputs, uniform_routing)
    with torch.no_grad():
        # a layer's routed tasks are reached only after its routing (the top-k, or with local routing the
        # router wave), from which their producers learn the layer's slot count
        run(schedule, numerics, order=order, seed=seed, live_slots=numerics.live_slots)
    return numerics.out


__all__ = [
    "BarrierCountError", "BarrierOverflow", "Deadlock", "HappensBefore", "Numerics", "RaceError",
    "ScheduleError", "check_races", "decode_step", "run",
]

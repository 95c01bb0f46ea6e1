"""A first-order timing model of a schedule: each SM runs its list in order, a task starts once its SM is
free and every barrier it waits on has completed, and runs for its wave's measured time.

What it is for: comparing placements and wave orders on the CPU before spending GPU time on them. It knows
the dependencies (the schedule's barriers), the SMs' lists and the claims (a claiming place takes the next
tile of its wave when its SM gets to it), and nothing of bandwidth: a task takes its wave's mean run time
from a traced launch whatever else streams beside it, so it cannot say what a change of bytes in flight
does. Times are in microseconds.

- ``durations``: per wave, a task's run time (``benchmarks.kernel_profile``'s "task run us");
- ``hop_us``: from a barrier's last signal to a waiting task's start (the signaller's fence and atomic,
  the waiter's poll);
- ``gap_us``: between two tasks of one SM (the loop's own work: the descriptor, the named barriers);
- ``signal_delay_us``: per wave, extra time from a task's end to its signal (the signal-delay probes of
  ``benchmarks/candidates/signal-delay``: the SM moves on, only the waiters see the signal later);
- ``live_slots``: per layer, the routed expert slots in use; a dead slot's tasks are skipped as the kernel's
  producer skips them (their signals counted as the top-k makes them up), a claiming place that draws a
  dead tile ends its wave on that SM. Left out, every slot is live.

Claims are settled when the SM gets free for the place; the kernel's producer claims up to the descriptor
ring's depth ahead (simulate.run models that, without times), so the model hands late tiles out a little
later than the kernel.
"""

from __future__ import annotations

import dataclasses
import statistics

from collections.abc import Callable

from vllm_megakernel.megakernel.abi import NO_BARRIER, ROUTED_OPS
from vllm_megakernel.megakernel.schedule import Schedule


@dataclasses.dataclass
class Timed:
    start: list[float]  # per task index (nan: never ran, a dead slot's task)
    end: list[float]
    sm_lists: list[list[int]]  # per SM, the tasks it ran in order (claimed tiles in their places)

    def layer_starts(self, schedule: Schedule) -> dict[int, float]:
        """Each layer's first task start."""
        first: dict[int, float] = {}
        for t in schedule.tasks:
            s = self.start[t.index]
            if s == s:  # not nan
                first[t.layer] = min(first.get(t.layer, s), s)
        return first

    def layer_period(self, schedule: Schedule, layers) -> float:
        """The median, over ``layers``, of the time from a layer's first task start to the next one's."""
        starts = self.layer_starts(schedule)
        return statistics.median(starts[layer + 1] - starts[layer] for layer in layers)

    def records(self, schedule: Schedule, tail_us: dict[str, float] | None = None):
        """The model's run as a traced launch's records (abi.TRACE_FIELDS, int64 ns), for megakernel.trace: each task
        that ran on its SM from its start to its end, its inputs and stages marks at the two ends of its body
        (critical_path reads such marks as no phases; a task of no time, an attention split the fluid model found
        without work, has none), its signal at its end plus its wave's ``tail_us`` (none: this model's hop is the
        whole signal path; the fluid model signals its waves' tails after the body); a task that did not run (a
        dead slot's) has no record."""
        import torch

        from vllm_megakernel.megakernel import abi

        rec = torch.zeros(len(schedule.tasks), len(abi.TRACE_FIELDS), dtype=torch.int64)
        col = {name: abi.TRACE_FIELDS.index(name) for name in abi.TRACE_FIELDS}
        for sm, tasks in enumerate(self.sm_lists):
            for i in tasks:
                start, end = round(1_000_000 + 1000 * self.start[i]), round(1_000_000 + 1000 * self.end[i])
                rec[i, col["sm"]] = rec[i, col["smid"]] = sm
                rec[i, col["wait_start_ns"]] = rec[i, col["run_start_ns"]] = start
                if end > start:
                    rec[i, col["inputs_ns"]], rec[i, col["stages_ns"]] = start, end
                rec[i, col["compute_end_ns"]] = end
                rec[i, col["end_ns"]] = end + round(1000 * (tail_us or {}).get(schedule.tasks[i].wave, 0.0))
        return rec

    def wave_ends(self, schedule: Schedule, layer: int) -> dict[str, tuple[float, float]]:
        """Per wave of ``layer``: (first start, last end), relative to the layer's first task start."""
        t0 = self.layer_starts(schedule)[layer]
        out: dict[str, tuple[float, float]] = {}
        for t in schedule.tasks:
            if t.layer == layer and self.start[t.index] == self.start[t.index]:
                s, e = self.start[t.index] - t0, self.end[t.index] - t0
                first, last = out.get(t.wave, (s, e))
                out[t.wave] = (min(first, s), max(last, e))
        return out


def claim_waves(schedule: Schedule) -> dict[int, list[int]]:
    """Each claim counter's wave: its tiles' task indices in the order the counter hands them out."""
    waves: dict[int, list[int]] = {}
    for t in schedule.tasks:
        if t.claim != NO_BARRIER:
            waves.setdefault(t.claim, []).append(t.index)
    return waves


def dead_tasks(schedule: Schedule, live_slots: Callable[[int], int] | None) -> set[int]:
    """The routed tasks of slots past ``live_slots(layer)`` (none if it is None), which the kernel's producer skips."""
    if live_slots is None:
        return set()
    return {t.index for t in schedule.tasks if t.op in ROUTED_OPS and t.fields["slot"] >= live_slots(t.layer)}


def timeline(schedule: Schedule, durations: dict[str, float], hop_us: float = 1.0, gap_us: float = 0.3,
             live_slots: Callable[[int], int] | None = None,
             signal_delay_us: dict[str, float] | None = None) -> Timed:
    """Runs the schedule in time order (every SM's list in order, claims in the order SMs reach them) and
    returns when each task ran. Raises ValueError on a wave without a duration or a schedule that cannot
    finish (simulate.run says why)."""
    missing = {t.wave for t in schedule.tasks} - set(durations)
    if missing:
        raise ValueError(f"no duration for waves {sorted(missing)}")
    claimable = claim_waves(schedule)
    claimed = dict.fromkeys(claimable, 0)
    n_tasks = len(schedule.tasks)
    start, end = [float("nan")] * n_tasks, [float("nan")] * n_tasks
    counts = [0] * len(schedule.barriers)
    done_at = [0.0] * len(schedule.barriers)  # the latest signal so far; the completion time once complete
    lists = [list(lst) for lst in schedule.sm_tasks]
    pcs = [0] * len(lists)
    free = [0.0] * len(lists)
    resolved = [False] * len(lists)  # whether the SM's next place has taken its claim
    exhausted: list[set[int]] = [set() for _ in lists]  # claim counters that handed the SM a dead tile
    dead = dead_tasks(schedule, live_slots)
    for i in dead:  # made up by the top-k (down) or waited on by dead tasks alone (up): complete by then
        t = schedule.tasks[i]
        if t.signal != NO_BARRIER:
            counts[t.signal] += 1

    def ready_time(sm: int) -> float | None:
        task = schedule.tasks[lists[sm][pcs[sm]]]
        at = free[sm]
        for b in task.waits:
            if counts[b] < schedule.barriers[b].target:
                return None
            at = max(at, done_at[b] + hop_us)
        return at

    remaining = sum(len(lst) for lst in lists)
    while remaining:
        best, best_at = None, None
        for sm in range(len(lists)):
            if pcs[sm] >= len(lists[sm]):
                continue
            if not resolved[sm]:  # a claiming place takes its tile when its SM gets to it: in time order
                continue
            at = ready_time(sm)
            if at is not None and (best_at is None or at < best_at):
                best, best_at = sm, at
        # claims: the SMs whose next place claims, in the order they got free, take the next tiles first
        claiming = sorted((free[sm], sm) for sm in range(len(lists))
                          if pcs[sm] < len(lists[sm]) and not resolved[sm])
        if claiming and (best_at is None or claiming[0][0] <= best_at):
            sm = claiming[0][1]
            task = schedule.tasks[lists[sm][pcs[sm]]]
            if task.claim != NO_BARRIER and task.claim not in exhausted[sm]:
                wave = claimable[task.claim]
                lists[sm][pcs[sm]] = wave[claimed[task.claim]]  # a wave has as many places as tiles
                claimed[task.claim] += 1
                if lists[sm][pcs[sm]] in dead:  # tiles are numbered slot by slot: every later claim is dead too
                    exhausted[sm].add(task.claim)
            if lists[sm][pcs[sm]] in dead or task.claim in exhausted[sm]:  # skipped: no time, no signal
                lists[sm].pop(pcs[sm])
                remaining -= 1
                continue
            resolved[sm] = True
            continue
        if best is None:
            raise ValueError("the schedule cannot finish in the timing model (see simulate.run for the deadlock)")
        task = schedule.tasks[lists[best][pcs[best]]]
        start[task.index] = best_at
        end[task.index] = best_at + durations[task.wave]
        free[best] = end[task.index] + gap_us
        if task.signal != NO_BARRIER:
            counts[task.signal] += 1
            signalled = end[task.index] + (signal_delay_us or {}).get(task.wave, 0.0)
            done_at[task.signal] = max(done_at[task.signal], signalled)
        pcs[best] += 1
        resolved[best] = False
        remaining -= 1
    return Timed(start, end, lists)


def durations_from_profile(result: dict) -> dict[str, float]:
    """Per-wave task run times from one row of kernel_profile's profile.json ("waves")."""
    return {w["wave"]: w["run_us"] for w in result["waves"]}


__all__ = ["Timed", "claim_waves", "dead_tasks", "durations_from_profile", "timeline"]

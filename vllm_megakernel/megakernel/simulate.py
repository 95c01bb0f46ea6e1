"""CPU interpreter of a megakernel schedule: the first test of any schedule change.

Three checks, none of which needs a GPU:

- ``run``: executes the per-SM task lists the way the kernel does -- each SM takes its tasks in order, a
  task starts only when every barrier it waits on has reached its target, finishing a task adds one to its
  signal barrier -- with a chosen interleaving of SMs. It raises :class:`Deadlock` when no SM can move
  (naming each stuck task, barrier, expected and seen counts), :class:`BarrierOverflow` when a barrier is
  signalled past its target, and :class:`BarrierCountError` when a barrier ends off its target.
- ``check_races``: proves from the barrier graph alone that any two tasks touching the same logical
  region, at least one of them writing, are ordered (happens-before through program order and barriers).
  A missing dependency fails here even when one lucky interleaving would have produced the right numbers.
- ``Numerics``: executes each opcode with torch ops on a workspace, as the kernel's tile would, so that a
  whole step run through the schedule can be compared with :func:`vllm_megakernel.reference.decode_step`.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable

import torch
import torch.nn.functional as F

from vllm_megakernel.megakernel.abi import NO_BARRIER
from vllm_megakernel.megakernel.schedule import Schedule, Task
from vllm_megakernel.reference import DecodeInputs, Weights, rms_norm, rope_interleaved, route


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
        seed: int = 0) -> list[int]:
    """Executes the schedule; returns task indices in the order they ran.

    ``order``: ``"round_robin"`` advances SMs in turn; ``"random"`` picks a random runnable SM each time
    (a different legal interleaving per seed); ``"reverse"`` prefers the highest-numbered runnable SM.
    """
    counts = [0] * len(schedule.barriers)
    pcs = [0] * len(schedule.sm_tasks)
    rng = random.Random(seed)
    done: list[int] = []
    remaining = sum(len(t) for t in schedule.sm_tasks)
    cursor = 0

    def runnable(sm: int) -> bool:
        if pcs[sm] >= len(schedule.sm_tasks[sm]):
            return False
        task = schedule.tasks[schedule.sm_tasks[sm][pcs[sm]]]
        return all(counts[b] >= schedule.barriers[b].target for b in task.waits)

    while remaining:
        ready = [sm for sm in range(len(pcs)) if runnable(sm)]
        if not ready:
            raise Deadlock(_deadlock_report(schedule, pcs, counts))
        if order == "random":
            sm = rng.choice(ready)
        elif order == "reverse":
            sm = ready[-1]
        else:
            sm = min(ready, key=lambda s: (s - cursor) % len(pcs))
            cursor = sm + 1
        task = schedule.tasks[schedule.sm_tasks[sm][pcs[sm]]]
        if execute is not None:
            execute(task)
        if task.signal != NO_BARRIER:
            counts[task.signal] += 1
            target = schedule.barriers[task.signal].target
            if counts[task.signal] > target:
                raise BarrierOverflow(
                    f"{task.describe()} signalled {schedule.barrier_name(task.signal)} to "
                    f"{counts[task.signal]}, past its target {target}"
                )
        pcs[sm] += 1
        remaining -= 1
        done.append(task.index)
    wrong = [(schedule.barrier_name(b), counts[b], bar.target) for b, bar in enumerate(schedule.barriers)
             if counts[b] != bar.target]
    if wrong:
        raise BarrierCountError("barriers off target after the step (name, seen, target): " + repr(wrong[:10]))
    return done


def _deadlock_report(schedule: Schedule, pcs: list[int], counts: list[int]) -> str:
    lines = []
    for sm, pc in enumerate(pcs):
        if pc >= len(schedule.sm_tasks[sm]):
            continue
        task = schedule.tasks[schedule.sm_tasks[sm][pc]]
        for b in task.waits:
            if counts[b] < schedule.barriers[b].target:
                lines.append(f"{task.describe()} waits on {schedule.barrier_name(b)}: "
                             f"expected {schedule.barriers[b].target}, seen {counts[b]}")
    return "deadlock: no SM can make progress\n  " + "\n  ".join(lines[:20])


def happens_before(schedule: Schedule) -> list[int]:
    """Per task, a bitset (Python int) of every task ordered before it by program order or barriers."""
    signallers: dict[int, list[int]] = defaultdict(list)
    for t in schedule.tasks:
        if t.signal != NO_BARRIER:
            signallers[t.signal].append(t.index)
    preds: list[list[int]] = [[] for _ in schedule.tasks]
    for sm_list in schedule.sm_tasks:
        for a, b in zip(sm_list, sm_list[1:]):
            preds[b].append(a)
    for t in schedule.tasks:
        for bar in t.waits:
            preds[t.index].extend(signallers[bar])
    order = run(schedule)  # a topological order (raises on deadlock)
    before = [0] * len(schedule.tasks)
    for i in order:
        acc = 0
        for p in preds[i]:
            acc |= before[p] | (1 << p)
        before[i] = acc
    return before


def check_races(schedule: Schedule) -> None:
    """Raises :class:`RaceError` naming two unordered tasks that touch one region, one of them writing."""
    before = happens_before(schedule)
    access: dict[tuple, list[tuple[int, bool]]] = defaultdict(list)
    for t in schedule.tasks:
        for r in t.reads:
            access[r].append((t.index, False))
        for r in t.writes:
            access[r].append((t.index, True))
    for region, users in access.items():
        writers = [i for i, w in users if w]
        for w in writers:
            for other, _ in users:
                if other == w:
                    continue
                if not (before[other] >> w) & 1 and not (before[w] >> other) & 1:
                    tw, to = schedule.tasks[w], schedule.tasks[other]
                    raise RaceError(f"{tw.describe()} writes {region} unordered with {to.describe()}")


class Numerics:
    """Executes opcodes with torch ops on a workspace laid out as the kernel's will be."""

    def __init__(self, schedule: Schedule, weights: Weights, inputs: DecodeInputs):
        self.s, self.dims, self.w, self.inp = schedule, schedule.dims, weights, inputs
        dims, B = schedule.dims, schedule.shape.batch
        dt, dev = weights.embed.dtype, weights.embed.device
        d, hq, hkv, S = dims.head_dim, dims.num_heads, dims.num_kv_heads, schedule.shape.attn_splits
        self.group = hq // hkv
        nan = float("nan")  # unwritten workspace must never be read
        self.x = torch.full((B, dims.hidden), nan, dtype=dt, device=dev)
        self.hn = torch.full_like(self.x, nan)
        self.q = torch.full((B, hq, d), nan, dtype=dt, device=dev)
        self.opart = torch.full((B, hkv, S, self.group, d), nan, dtype=torch.float32, device=dev)
        self.lse = torch.full((B, hkv, S, self.group), nan, dtype=torch.float32, device=dev)
        self.attn = torch.full((B, hq * d), nan, dtype=dt, device=dev)
        self.o = torch.full_like(self.x, nan)
        self.mlp = torch.full_like(self.x, nan)
        self.out = torch.full_like(self.x, nan)
        moe_i, dense_i = weights.intermediates()
        self.dact = torch.full((B, dense_i), nan, dtype=dt, device=dev)
        K = dims.top_k
        self.act = torch.full((B * K, moe_i), nan, dtype=dt, device=dev)
        self.eout = torch.full((B * K, dims.hidden), nan, dtype=dt, device=dev)
        self.topk_w = torch.zeros(B, K, dtype=torch.float32, device=dev)
        self.slot_expert: list[int] = []
        self.slot_rows: list[list[int]] = []
        self.live = inputs.seq_lens > 0

    # -- the kernel's workspace (runtime.allocate_workspace): every buffer is used as a flat prefix laid out
    # for this schedule's batch and splits; the route buffer is [num_active, slot_expert[slots],
    # slot_count[slots], slot_rows[slots][batch]] (csrc/common.cuh).
    _BUFFERS = ("x", "hn", "q", "opart", "lse", "attn", "o", "mlp", "out", "dact", "act", "eout", "topk_w")

    def load_workspace(self, ws: dict[str, torch.Tensor]) -> None:
        """Adopts the state of a kernel workspace, e.g. after the kernel ran a truncated schedule, so the
        next wave can be executed here with torch ops on exactly the kernel's inputs."""
        for name in self._BUFFERS:
            dst = getattr(self, name)
            dst.copy_(ws[name].reshape(-1)[: dst.numel()].view(dst.shape))
        route = ws["route"].tolist()
        slots, B = self.s.num_slots, self.s.shape.batch
        active = route[0]
        self.slot_expert = route[1:1 + active]
        counts = route[1 + slots:1 + slots + active]
        base = 1 + 2 * slots
        self.slot_rows = [route[base + s * B:base + s * B + counts[s]] for s in range(active)]

    def store_workspace(self, ws: dict[str, torch.Tensor]) -> None:
        """The inverse of :meth:`load_workspace`: writes this state in the kernel's layout."""
        for name in self._BUFFERS:
            src = getattr(self, name)
            ws[name].reshape(-1)[: src.numel()].copy_(src.reshape(-1))
        slots, B = self.s.num_slots, self.s.shape.batch
        route = ws["route"]
        route[0] = len(self.slot_expert)
        for s, (e, rows) in enumerate(zip(self.slot_expert, self.slot_rows)):
            route[1 + s] = e
            route[1 + slots + s] = len(rows)
            base = 1 + 2 * slots + s * B
            route[base:base + len(rows)] = torch.tensor(rows, dtype=route.dtype)

    def cols(self, tile: int) -> slice:
        n = self.s.shape.tile_n
        return slice(tile * n, (tile + 1) * n)

    def __call__(self, task: Task) -> None:
        getattr(self, task.op.name.lower())(task.layer, **task.fields)

    # -- norms
    def embed_rmsnorm(self, layer: int) -> None:
        self.x[:] = self.w.embed[self.inp.input_ids.long()]
        self.hn[:] = rms_norm(self.x, self.w.layers[0].norm, self.dims.eps)

    def _residual(self) -> None:
        self.x[:] = self.x + self.o + self.mlp  # (x + attn) + mlp, the order vLLM adds in

    def add_rmsnorm(self, layer: int) -> None:
        self._residual()
        self.hn[:] = rms_norm(self.x, self.w.layers[layer].norm, self.dims.eps)

    def final_norm(self, layer: int) -> None:
        self._residual()
        self.out[:] = torch.where(self.live[:, None], rms_norm(self.x, self.w.final_norm, self.dims.eps),
                                  torch.zeros_like(self.x))

    # -- attention
    def qkv_rope(self, layer: int, head: int) -> None:
        dims, d = self.dims, self.dims.head_dim
        y = self.hn @ self.w.layers[layer].qkv[head * d:(head + 1) * d].t()  # [B, D]
        hq, hkv = dims.num_heads, dims.num_kv_heads
        if head < hq + hkv and dims.rope[layer]:
            y = rope_interleaved(y[:, None], self.inp.positions, dims.rope_theta)[:, 0]
        if head < hq:
            self.q[:, head] = y
            return
        kv_index, g = (0, head - hq) if head < hq + hkv else (1, head - hq - hkv)
        cache = self.inp.kv_caches[layer]
        slots = self.inp.groups[self.inp.layer_group[layer]].slot_mapping
        bs = cache.shape[2]
        for r, slot in enumerate(slots.tolist()):
            if slot >= 0:
                cache[slot // bs, kv_index, slot % bs, g] = y[r]

    def attn_partial(self, layer: int, request: int, kv_head: int, split: int, num_splits: int) -> None:
        seq_len = int(self.inp.seq_lens[request])
        lo, hi = self._split_range(layer, seq_len, split, num_splits)
        if lo >= hi:  # past the end of this sequence (or a padding row): nothing to attend
            self.opart[request, kv_head, split] = 0.0
            self.lse[request, kv_head, split] = float("-inf")
            return
        cache = self.inp.kv_caches[layer]
        table = self.inp.groups[self.inp.layer_group[layer]].block_table[request]
        bs = cache.shape[2]
        pos = torch.arange(lo, hi, device=cache.device)
        blocks, offs = table[pos // bs].long(), pos % bs
        k = cache[blocks, 0, offs, kv_head].float()  # [T, D]
        v = cache[blocks, 1, offs, kv_head].float()
        q = self.q[request, kv_head * self.group:(kv_head + 1) * self.group].float()  # [G, D]
        scores = (q @ k.t()) * self.dims.head_dim ** -0.5  # [G, T]
        m = scores.max(-1, keepdim=True).values
        p = (scores - m).exp()
        denom = p.sum(-1, keepdim=True)
        self.opart[request, kv_head, split] = (p @ v) / denom
        self.lse[request, kv_head, split] = (m + denom.log())[:, 0]

    def _split_range(self, layer: int, seq_len: int, split: int, num_splits: int) -> tuple[int, int]:
        window = self.dims.sliding_window if self.dims.sliding[layer] else None
        start = 0 if window is None else max(0, seq_len - window)
        chunk = -(-(seq_len - start) // num_splits)
        lo = start + split * chunk
        return lo, min(seq_len, lo + chunk)

    def attn_combine(self, layer: int, request: int, kv_head: int, num_splits: int) -> None:
        heads = slice(kv_head * self.group * self.dims.head_dim, (kv_head + 1) * self.group * self.dims.head_dim)
        lse = self.lse[request, kv_head]  # [S, G]
        if not torch.isfinite(lse).any():  # padding row: no keys at all
            self.attn[request, heads] = 0.0
            return
        scale = (lse - lse.max(0).values).exp()  # [S, G]
        out = (self.opart[request, kv_head] * scale[..., None]).sum(0) / scale.sum(0)[:, None]
        self.attn[request, heads] = out.reshape(-1).to(self.attn.dtype)

    def o_proj(self, layer: int, col_tile: int) -> None:
        c = self.cols(col_tile)
        self.o[:, c] = self.attn @ self.w.layers[layer].o[c].t()

    # -- dense prefix MLP
    def dense_upgate(self, layer: int, col_tile: int) -> None:
        lw, c = self.w.layers[layer], self.cols(col_tile)
        inter = lw.down.shape[1]
        gate = self.hn @ lw.gate_up[c].t()
        up = self.hn @ lw.gate_up[inter + c.start:inter + c.stop].t()
        self.dact[:, c] = F.silu(gate) * up

    def dense_down(self, layer: int, col_tile: int) -> None:
        c = self.cols(col_tile)
        self.mlp[:, c] = self.dact @ self.w.layers[layer].down[c].t()

    # -- MoE
    def router(self, layer: int) -> None:
        dims = self.dims
        weights, experts, _ = route(self.hn, self.w.layers[layer].router, dims)
        self.topk_w[:] = weights
        rows: dict[int, list[int]] = defaultdict(list)
        for r in range(experts.shape[0]):
            if self.live[r]:  # padding rows route nowhere
                for k, e in enumerate(experts[r].tolist()):
                    rows[e].append(r * dims.top_k + k)
        self.slot_expert = sorted(rows)
        self.slot_rows = [rows[e] for e in self.slot_expert]

    def moe_upgate(self, layer: int, slot: int, col_tile: int) -> None:
        if slot >= len(self.slot_expert):
            return  # fewer experts chosen than slots: this slot has no work
        lw, c, K = self.w.layers[layer], self.cols(col_tile), self.dims.top_k
        inter = lw.w2.shape[2]
        e, rows = self.slot_expert[slot], self.slot_rows[slot]
        h = self.hn[[r // K for r in rows]]
        gate = h @ lw.w13[e, c].t()
        up = h @ lw.w13[e, inter + c.start:inter + c.stop].t()
        self.act[rows, c] = F.silu(gate) * up

    def moe_down(self, layer: int, slot: int, col_tile: int) -> None:
        if slot >= len(self.slot_expert):
            return
        c = self.cols(col_tile)
        e, rows = self.slot_expert[slot], self.slot_rows[slot]
        self.eout[rows, c] = self.act[rows] @ self.w.layers[layer].w2[e, c].t()

    def moe_combine(self, layer: int, col_tile: int) -> None:
        c, K = self.cols(col_tile), self.dims.top_k
        acc = torch.zeros(self.mlp[:, c].shape, dtype=torch.float32, device=self.mlp.device)
        for r in range(acc.shape[0]):
            if self.live[r]:
                for k in range(K):
                    acc[r] += self.topk_w[r, k] * self.eout[r * K + k, c].float()
        self.mlp[:, c] = acc.to(self.mlp.dtype)


def decode_step(schedule: Schedule, weights: Weights, inputs: DecodeInputs, order: str = "round_robin",
                seed: int = 0) -> torch.Tensor:
    """One decode step executed task by task through ``schedule``; returns the final hidden states."""
    if inputs.input_ids.shape[0] != schedule.shape.batch:
        raise ValueError(f"inputs have batch {inputs.input_ids.shape[0]}, schedule {schedule.shape.batch}")
    numerics = Numerics(schedule, weights, inputs)
    with torch.no_grad():
        run(schedule, numerics, order=order, seed=seed)
    return numerics.out


__all__ = [
    "BarrierCountError", "BarrierOverflow", "Deadlock", "Numerics", "RaceError", "ScheduleError",
    "check_races", "decode_step", "happens_before", "run",
]

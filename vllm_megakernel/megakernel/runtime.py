"""Device side of the host: the step and layer tables, the workspace, the launch, and stall reports.

Everything the kernel reads is described by :mod:`vllm_megakernel.megakernel.abi`: the task list (from
:class:`~vllm_megakernel.megakernel.schedule.Schedule`), a step table of int64 words (dimensions, weight and
workspace addresses, vLLM's per-step input buffers) and one layer-table row per layer (weights, KV cache
and its strides, the layer's KV-cache group's block table and slot mapping). Weights and KV caches are
read in place: only addresses are stored. All buffers stay at fixed addresses for the life of a
:class:`DeviceStep`, so a launch can be captured in a CUDA graph and replayed.
"""

from __future__ import annotations

import dataclasses
import math
import struct

import torch

from vllm_megakernel.megakernel import abi, layout
from vllm_megakernel.megakernel.schedule import EncodedSchedule, Schedule
from vllm_megakernel.reference import DecodeInputs, Weights


class MegakernelStallError(RuntimeError):
    """A task's wait timed out: the kernel gave up and recorded which task and barrier stalled."""


def _f64_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _addr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


@dataclasses.dataclass
class DeviceStep:
    schedule: Schedule | EncodedSchedule
    step_table: torch.Tensor
    layer_table: torch.Tensor
    tasks: torch.Tensor
    barriers: torch.Tensor
    error: torch.Tensor
    workspace: dict[str, torch.Tensor]
    intermediates: tuple[int, int]  # (expert FFN width, dense FFN width): the workspace shapes need them
    keepalive: list[torch.Tensor]  # converted inputs referenced by address in the tables
    unsupported: list[str]  # how the model differs from the shape the kernel is compiled for (launch refuses)
    trace: torch.Tensor | None = None  # int64 [num_tasks, len(abi.TRACE_FIELDS)] when built with trace=True

    @property
    def out(self) -> torch.Tensor:
        return self.view("out")

    def view(self, name: str) -> torch.Tensor:
        """A workspace buffer with this step's shape (layout.workspace_spec)."""
        s = self.schedule
        shape, _ = layout.workspace_spec(s.dims, s.shape.batch, s.shape.attn_splits, *self.intermediates)[name]
        return self.workspace[name][: math.prod(shape)].view(shape)


def new_error_record(device) -> torch.Tensor:
    """A cleared stall record (abi.ERROR_FIELDS): the kernel's first reporter claims it by swapping "sm" from -1."""
    err = torch.zeros(len(abi.ERROR_FIELDS), dtype=torch.int32, device=device)
    err[abi.ERROR_FIELDS.index("sm")] = -1
    return err


def workspace_dtype(kind: str, activations: torch.dtype) -> torch.dtype:
    """The torch dtype of a layout.workspace_spec dtype name; "bf16" buffers hold activations, in the
    weights' dtype (bf16 on the GPU, float32 in the CPU simulator's checks)."""
    return {"bf16": activations, "f32": torch.float32, "i32": torch.int32}[kind]


def allocate_workspace(dims, steps: list[tuple[int, int]], moe_intermediate: int, dense_intermediate: int,
                       device, dtype=torch.bfloat16, route_log: bool = False) -> dict[str, torch.Tensor]:
    """The kernel's scratch buffers for every step in ``steps`` ((batch, attention splits) pairs): each
    buffer is as large as the largest step needs (one step runs at a time, and every index the kernel
    computes depends on the step's own batch and splits, so a smaller step uses a prefix; the shapes are
    layout.workspace_spec's). Filled with NaN: a read of anything the step did not write shows up."""
    sizes: dict[str, int] = {}
    kinds: dict[str, str] = {}
    for batch, splits in steps:
        for name, (shape, kind) in layout.workspace_spec(dims, batch, splits, moe_intermediate,
                                                         dense_intermediate).items():
            sizes[name] = max(sizes.get(name, 0), math.prod(shape))
            kinds[name] = kind
    ws = {}
    for name, n in sizes.items():
        dt = workspace_dtype(kinds[name], dtype)
        ws[name] = torch.full((n,), float("nan"), dtype=dt, device=device) if dt.is_floating_point \
            else torch.zeros(n, dtype=dt, device=device)
    if route_log:
        max_batch = max(b for b, _ in steps)
        ws["route_log"] = torch.full((dims.num_layers * max_batch * dims.top_k,), -1, dtype=torch.int32,
                                     device=device)
    return ws


def routing_log(workspace: dict[str, torch.Tensor], dims, batch: int) -> torch.Tensor:
    """int32 [num_layers, batch, top_k]: the experts the last launch of a ``batch``-row step chose per MoE layer
    and row (-1 on dense layers), viewed from a workspace allocated with ``route_log`` for this batch or more."""
    n = dims.num_layers * batch * dims.top_k
    return workspace["route_log"].view(-1)[:n].view(dims.num_layers, batch, dims.top_k)


def routed_experts(workspace: dict[str, torch.Tensor], dims, batch: int) -> dict[int, int]:
    """Each MoE layer's count of distinct experts (its routed slots) in the last launch of a ``batch``-row step:
    the route buffer's layer_active words (layout.route_offsets), which each layer's top-k writes and no later
    task of the step rewrites. Readable after a CUDA graph replayed the step, where no Python ran. Their place
    depends on ``batch``: after a launch of another size they hold that launch's other words."""
    at = layout.route_offsets(dims, batch)["layer_active"]
    words = workspace["route"][at:at + dims.num_layers].tolist()
    return {layer: n for layer, n in enumerate(words) if not dims.dense[layer]}


def mean_routed_experts(workspace: dict[str, torch.Tensor], dims, batch: int) -> float | None:
    """:func:`routed_experts`' mean over MoE layers, or None unless every layer's count could be a ``batch``-row
    step's (top_k to min(experts, batch x top_k): a live row routes top_k distinct experts), as when a launch of
    another size, or none, was the last."""
    counts = routed_experts(workspace, dims, batch)
    most = min(dims.num_experts, batch * dims.top_k)
    if not counts or any(not dims.top_k <= n <= most for n in counts.values()):
        return None
    return sum(counts.values()) / len(counts)


def _route_posts_at(schedule: Schedule | EncodedSchedule) -> int:
    """int32 word of the step's barrier array where the posted route words start: after the barriers, 8-byte
    aligned."""
    return (schedule.num_barriers + 1) // 2 * 2


def route_posts(step: DeviceStep) -> torch.Tensor:
    """int64 [num_layers, 1 + num_slots]: the posted route words the last launch of a step with posted routing
    stored (abi.ROUTE_POST; StepShape.posted_routing), viewed from its barrier array; decode with
    abi.unpack_route_post (the first word of a layer: its routed slot count under the posted bit)."""
    s = step.schedule
    if not s.route_post_words:
        raise ValueError(f"the batch-{s.shape.batch} step has no posted routing")
    at = _route_posts_at(s)
    return step.barriers[at:at + 2 * s.route_post_words].view(torch.int64).view(s.dims.num_layers, -1)


def score_posts(step: DeviceStep) -> torch.Tensor:
    """int32 [num_layers, batch, num_experts]: the score keys the last launch of a step with posted scores stored
    (StepShape.posted_scores; a score's bits + 2, 1 for a NaN, 0 where none was posted), viewed from its barrier
    array."""
    s = step.schedule
    if not s.score_post_words:
        raise ValueError(f"the batch-{s.shape.batch} step has no posted scores")
    at = _route_posts_at(s) + 2 * s.route_post_words
    return step.barriers[at:at + s.score_post_words].view(s.dims.num_layers, s.shape.batch, -1)


def check_kv_cache(cache: torch.Tensor, layer: int) -> None:
    """The kernel copies 16-token K/V tiles of every KV head with bulk copies: within a block, tokens and
    heads must be contiguous, and every stride a multiple of 16 bytes."""
    _, _, bs, hkv, d = cache.shape
    if cache.dtype != torch.bfloat16 or cache.stride(-1) != 1 or cache.stride(3) != d or cache.stride(2) != hkv * d:
        raise ValueError(f"layer {layer}: the KV cache must be bf16 with each block's tokens and heads contiguous, "
                         f"got {cache.dtype} strides {cache.stride()}")
    if any(s % 8 for s in cache.stride()[:3]) or cache.data_ptr() % 16:
        raise ValueError(f"layer {layer}: KV cache strides {cache.stride()} are not 16-byte aligned")
    if not (bs % layout.ATTN_TILE == 0 or layout.ATTN_TILE % bs == 0):
        raise ValueError(f"block size {bs} neither divides nor is a multiple of {layout.ATTN_TILE}")


def build_step(schedule: Schedule | EncodedSchedule, weights: Weights, inputs: DecodeInputs, timeout_s: float = 5.0,
               route_log: bool = False, workspace: dict[str, torch.Tensor] | None = None,
               trace: bool = False, uniform_routing: bool = False,
               encoded: torch.Tensor | None = None, error: torch.Tensor | None = None) -> DeviceStep:
    """Tables for ``schedule`` over these weights and input buffers (all on one CUDA device).

    ``workspace`` (from :func:`allocate_workspace`, sized for this step or more) is shared between the
    steps of different batch sizes; without it a private one is allocated. ``route_log`` records each MoE
    layer's experts in ``workspace["route_log"]`` (int32 [num_layers, B, K]). ``trace`` makes every launch
    record where and when each task ran in :attr:`DeviceStep.trace` (see :mod:`.trace`). ``uniform_routing``
    draws every MoE layer's experts uniformly at random (reference.uniform_experts) instead of routing.
    ``encoded``: ``schedule.encode()`` computed before (it depends on the schedule alone; an EncodedSchedule,
    what the vLLM decoder keeps, returns its own from encode()). ``error``: a stall
    record (:func:`new_error_record`) to share with other steps, so that one record answers for whichever step a
    CUDA graph replayed (the decoder's steps share one); a private one by default.
    """
    dims, shape = schedule.dims, schedule.shape
    B, S = shape.batch, shape.attn_splits
    if encoded is None:
        encoded = schedule.encode()
    elif encoded.shape[0] != len(schedule.sm_task_counts) or encoded.shape[1] <= max(schedule.sm_task_counts):
        raise ValueError(f"encoded task lists {tuple(encoded.shape)} are not this schedule's")
    dev, dt = weights.embed.device, weights.embed.dtype
    if error is None:
        error = new_error_record(dev)
    elif (error.dtype != torch.int32 or error.shape != (len(abi.ERROR_FIELDS),)
          or error.device != torch.empty(0, device=dev).device):
        raise ValueError(f"a stall record is int32 [{len(abi.ERROR_FIELDS)}] on {dev}, got {error.dtype} "
                         f"{tuple(error.shape)} on {error.device}")
    if dt != torch.bfloat16:
        raise ValueError(f"the megakernel runs bf16 weights, got {dt}")
    moe_i, dense_i = weights.intermediates()
    if workspace is None:
        workspace = allocate_workspace(dims, [(B, S)], moe_i, dense_i, dev, dt, route_log)
    ws = workspace
    need = allocate_workspace(dims, [(B, S)], moe_i, dense_i, "meta", dt, route_log)
    for name, t in need.items():
        if name not in ws or ws[name].numel() < t.numel():
            raise ValueError(f"workspace buffer {name!r} is too small for batch {B} / {S} splits")
    ids = inputs.input_ids.to(device=dev, dtype=torch.int32).contiguous()
    positions = inputs.positions.to(device=dev, dtype=torch.int64).contiguous()
    seq_lens = inputs.seq_lens.to(device=dev, dtype=torch.int32).contiguous()
    if ids.shape[0] != B:
        raise ValueError(f"inputs have batch {ids.shape[0]}, schedule {B}")
    keep = [ids, positions, seq_lens]
    route = layout.route_offsets(dims, B)
    # the barriers, then (posted routing) the posted route words (route_posts), then (posted scores) the score
    # keys (score_posts): launch() zeroes them all
    posts_at = _route_posts_at(schedule)
    scores_at = posts_at + 2 * schedule.route_post_words
    barriers = torch.zeros(scores_at + schedule.score_post_words, dtype=torch.int32, device=dev)

    step = {
        "batch": B, "num_slots": schedule.num_slots, "block_size": inputs.kv_caches[0].shape[2],
        "sliding_window": dims.sliding_window or 0, "attn_splits": S, "attn_min_tiles": shape.attn_min_tiles,
        "attn_live_splits": shape.attn_live_splits, "attn_max_tiles": shape.attn_max_tiles,
        "norm_topk_prob": int(dims.norm_topk_prob), "uniform_routing": int(uniform_routing),
        "local_routing": int(shape.local_routing), "posted_routing": int(shape.posted_routing),
        "stages_in_flight": shape.stages_in_flight, "o_prefetch": int(shape.o_prefetch),
        "eps_f64": _f64_bits(dims.eps),
        "rope_theta_f64": _f64_bits(dims.rope_theta), "timeout_ns": int(timeout_s * 1e9),
        "route_expert_off": route["expert"], "route_count_off": route["count"], "route_rows_off": route["rows"],
        "route_posts": _addr(barriers[posts_at:]) if schedule.route_post_words else 0,
        "score_posts": _addr(barriers[scores_at:]) if schedule.score_post_words else 0,
        "embed": _addr(weights.embed), "final_norm": _addr(weights.final_norm),
        "input_ids": _addr(ids), "positions": _addr(positions), "seq_lens": _addr(seq_lens),
        **{name: _addr(t) for name, t in ws.items() if name != "route_log" or route_log},
    }
    step.setdefault("route_log", 0)
    trace_buf = None
    if trace:  # every launch of this step zeroes it and writes one record per task that ran (megakernel.trace)
        trace_buf = torch.zeros(schedule.num_tasks, len(abi.TRACE_FIELDS), dtype=torch.int64, device=dev)
    step["trace"] = _addr(trace_buf) if trace_buf is not None else 0
    step_table = torch.tensor([step[f] for f in abi.STEP_FIELDS], dtype=torch.int64, device=dev)

    rows = []
    for i, lw in enumerate(weights.layers):
        cache = inputs.kv_caches[i]
        check_kv_cache(cache, i)
        group = inputs.groups[inputs.layer_group[i]]
        table = group.block_table.to(device=dev, dtype=torch.int32).contiguous()
        slots_map = group.slot_mapping.to(device=dev, dtype=torch.int64).contiguous()
        keep += [table, slots_map]
        weight_of = {"norm_w": lw.norm, "qkv_w": lw.qkv, "o_w": lw.o, "gate_up_w": lw.gate_up, "down_w": lw.down,
                     "router_w": lw.router, "w13": lw.w13, "w2": lw.w2}
        for name, t in weight_of.items():
            if t is not None and (not t.is_contiguous() or t.dtype != dt or t.data_ptr() % 16):
                raise ValueError(f"layer {i}: {name} must be contiguous, 16-byte aligned {dt}")
        row = {
            "dense": int(dims.dense[i]), "sliding": int(dims.sliding[i]), "rope": int(dims.rope[i]),
            **{name: _addr(t) for name, t in weight_of.items()},
            "kv_cache": _addr(cache), "kv_stride_block": cache.stride(0), "kv_stride_kv": cache.stride(1),
            "kv_stride_token": cache.stride(2), "kv_stride_head": cache.stride(3),
            "block_table": _addr(table), "block_table_stride": table.stride(0), "slot_mapping": _addr(slots_map),
        }
        rows.append([row[f] for f in abi.LAYER_FIELDS])
    layer_table = torch.tensor(rows, dtype=torch.int64, device=dev)

    return DeviceStep(
        schedule=schedule, step_table=step_table, layer_table=layer_table,
        tasks=encoded.to(dev), barriers=barriers,
        error=error, workspace=ws, intermediates=(moe_i, dense_i), keepalive=keep,
        unsupported=layout.model_mismatches(dims, moe_i, dense_i), trace=trace_buf,
    )


def launch(step: DeviceStep, ext=None) -> None:
    """Enqueues one step on torch's current stream: zero the barriers, run the kernel. No host sync. ``ext``: the
    extension module to launch (default the package's own ``_C``; benchmarks.ab.interleaved passes other builds
    of the same ABI)."""
    if ext is None:
        from vllm_megakernel import _C as ext
    from vllm_megakernel.extension import abi_mismatch

    if problem := abi_mismatch(ext):
        raise ValueError(f"extension {getattr(ext, '__name__', ext)}: {problem}: rebuild it")
    if step.unsupported:
        raise ValueError("the megakernel is compiled for another model shape: " + "; ".join(step.unsupported))
    step.barriers.zero_()
    if step.trace is not None:  # a dead slot's skipped task leaves no record: none may stay from a launch before
        step.trace.zero_()
    ext.launch_decode(
        step_table=step.step_table.data_ptr(), layer_table=step.layer_table.data_ptr(),
        tasks=step.tasks.data_ptr(), max_tasks=step.tasks.shape[1], grid=step.tasks.shape[0],
        barriers=step.barriers.data_ptr(), error=step.error.data_ptr(),
        stream=torch.cuda.current_stream(step.tasks.device).cuda_stream,
    )


def check(step: DeviceStep) -> None:
    """Synchronises and raises :class:`MegakernelStallError` if a wait timed out (then clears the record)."""
    err = dict(zip(abi.ERROR_FIELDS, step.error.tolist()))
    if not err["flag"]:
        return
    step.error.copy_(new_error_record(step.error.device))
    s = step.schedule
    task = s.tasks[err["task_index"]] if 0 <= err["task_index"] < s.num_tasks else None
    what = task.describe() if task else f"task {err['task_index']}"
    if task is not None and task.claim != abi.NO_BARRIER:  # it ran on the SM that claimed it, named below
        what += " (a claimed expert tile, dealt there)"
    if err["barrier"] == abi.POSTED_ROUTE_WAIT:
        seen = "not posted" if err["seen"] < 0 else f"{err['seen']} routed slots posted"
        waited = f"polled layer {err['layer']}'s posted route for slot {err['expected']}: {seen}"
    elif err["barrier"] == abi.POSTED_SCORE_WAIT:
        waited = (f"polled layer {err['layer']}'s posted scores of batch row {err['expected']}: {err['seen']} of "
                  f"{s.dims.num_experts} posted")
    else:
        waited = (f"waited on barrier {err['barrier']} ({s.barrier_name(err['barrier'])}): expected "
                  f"{err['expected']}, saw {err['seen']}")
    raise MegakernelStallError(
        f"megakernel stalled in the batch-{s.shape.batch} step: {what} (opcode {abi.Op(err['opcode']).name}, "
        f"layer {err['layer']}) on SM {err['sm']} {waited}"
    )


def run_step(step: DeviceStep) -> torch.Tensor:
    launch(step)
    check(step)
    return step.out

"""The megakernel inside vLLM: which batches it takes, and one task list per padded batch size.

vLLM captures the whole model forward in a FULL CUDA graph per padded decode batch size, replaying it
without running Python. So everything a launch reads must sit at a fixed address: vLLM's persistent input
buffers (input ids, positions), the attention metadata it rebuilds in place each step (seq_lens, block
tables, slot mappings -- one of each per KV-cache group of the hybrid manager), the KV caches, the weights,
and our own workspace and tables. A task list is built in the eager warm-up pass vLLM runs right before it
captures a size, and is keyed by every address it embeds: vLLM first captures against a temporary KV
cache while it profiles memory and then frees it, so a changed key means "rebuild", and a capture that
finds no matching task list is an error rather than a stale replay.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future

import torch

from vllm_megakernel.megakernel import abi, layout, runtime
from vllm_megakernel.megakernel.abi import NO_BARRIER
from vllm_megakernel.megakernel.schedule import EncodedSchedule, Schedule, StepShape, build_schedule
from vllm_megakernel.reference import DecodeInputs, KVGroup, ModelDims, Weights

# The largest padded batch the megakernel serves; bigger decode batches take vLLM's stock path.
MAX_BATCH = layout.MAX_BATCH

logger = logging.getLogger("vllm.megakernel")


def unsupported_model_reasons(hf_config) -> list[str]:
    """Model shapes the kernel is not compiled for (North Mini Code itself fits)."""
    dims = ModelDims.from_config(hf_config)
    dense_i = getattr(hf_config, "prefix_dense_intermediate_size", None) or 0
    return layout.model_mismatches(dims, hf_config.intermediate_size, dense_i)


def batch_limit(compilation_config, max_batch: int = MAX_BATCH) -> int:
    """The largest decode batch the megakernel takes: its own limit, and never a batch above vLLM's largest
    CUDA-graph size (those run eagerly on vLLM's path) when graphs are on."""
    mode = getattr(compilation_config, "cudagraph_mode", None)
    largest = getattr(compilation_config, "max_cudagraph_capture_size", None)
    graphs_on = mode is not None and getattr(mode, "name", str(mode)) != "NONE"
    if graphs_on and largest:
        return min(max_batch, int(largest))
    return max_batch


def is_pure_decode(attn_metadata, batch: int | None = None) -> bool:
    """Every request has exactly one query token and nothing asks for cascade attention; with ``batch`` (the
    rows of input ids), the metadata also covers every one of those rows. vLLM pads a decode batch up to a
    capture size; under a FULL graph it pads the attention metadata too (padding rows: seq_len 0, slot -1,
    the null block), but under a PIECEWISE graph it pads only the input ids, and the seq_lens and block-table
    views keep the real request count: the kernel would read the rows past them from stale or, past
    max_num_seqs, foreign memory, and its task list would be rebuilt whenever the request count changes."""
    if not isinstance(attn_metadata, dict) or not attn_metadata:
        return False  # None during profiling/dummy runs, a list under dual-batch overlap
    for md in attn_metadata.values():
        if getattr(md, "max_query_len", None) != 1 or getattr(md, "use_cascade", False):
            return False
        if batch is not None and any(_rows(getattr(md, name, None)) < batch for name in ("seq_lens", "block_table")):
            return False
    return True


def _rows(t) -> int:
    return t.shape[0] if t is not None and t.dim() else 0


class ScheduleCache:
    """Each batch size's schedule, encoded (schedule.encode(), on the host), built once and kept: vLLM builds a
    step per capture size twice at start-up (against its profiling KV cache, then the real one). What is kept
    of a schedule is an :class:`EncodedSchedule` (its shape, counts and encoded tables; the task list is rebuilt
    only if a stall report or a trace asks for it).

    :meth:`prebuild` builds the sizes known ahead (the FULL decode graphs' capture sizes) on one background
    thread from the model's construction on, largest first as vLLM captures them, so that the pure-Python
    building (1-2 s a size from batch 16 up on the CPU machine) overlaps vLLM's weight loading and
    torch.compile instead of adding to the graph capture. :meth:`get` waits for a size's build under way, or
    builds the size on the calling thread (one not started yet, or one nobody asked for ahead: eager decode
    batches); a build's error is raised there. Building makes no CUDA call (plain Python and CPU tensors): a
    thread that made one while vLLM captures a graph on another would break the capture (global capture mode)."""

    def __init__(self, build: Callable[[int], Schedule]):
        self._build = build
        self._built: dict[int, EncodedSchedule] = {}
        self._pending: dict[int, Future] = {}

    def _make(self, batch: int) -> EncodedSchedule:
        sched = self._build(batch)
        return EncodedSchedule(sched, sched.encode(), lambda: self._build(batch))

    def prebuild(self, batches: Iterable[int]) -> None:
        todo = sorted({b for b in batches if b not in self._built and b not in self._pending}, reverse=True)
        futures = {b: Future() for b in todo}
        self._pending.update(futures)

        def run() -> None:
            t0, done = time.perf_counter(), []
            for b, fut in futures.items():
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(self._make(b))
                        done.append(b)
                    except BaseException as e:  # raised to whoever asks for this size
                        fut.set_exception(e)
            # start-up diagnosis: when the thread's work ended, against the server log's other stages
            logger.info("vllm_megakernel: built the task lists of batch sizes %s on a background thread in %.1f s",
                        done, time.perf_counter() - t0)

        if todo:
            threading.Thread(target=run, name="vllm_megakernel-schedules", daemon=True).start()

    def get(self, batch: int) -> EncodedSchedule:
        if batch not in self._built:
            fut = self._pending.pop(batch, None)
            # a size the thread has not started is built here (the thread then skips it), not after the
            # larger ones queued before it
            self._built[batch] = self._make(batch) if fut is None or fut.cancel() else fut.result()
        return self._built[batch]


def prebuilt_batches(compilation_config, scheduler_config, max_batch: int) -> list[int]:
    """The decode batch sizes vLLM will capture FULL graphs of, up to ``max_batch``: every capture size up to
    max_num_seqs when the graph mode has FULL graphs (vLLM pads a decode batch up to one of them); none
    otherwise (batches then run eagerly at their own sizes, built when they first come)."""
    mode = getattr(compilation_config, "cudagraph_mode", None)
    if mode is None or not mode.has_full_cudagraphs():
        return []
    limit = min(max_batch, getattr(scheduler_config, "max_num_seqs", max_batch))
    return sorted(b for b in (compilation_config.cudagraph_capture_sizes or []) if b <= limit)


def new_stats() -> dict:
    """MegakernelDecoder.stats, all counts at zero."""
    return {"python_launches": 0, "builds": 0, "build_ms": 0.0, "schedule_ms": 0.0, "rebuilds": 0, "rebuild_ms": 0.0,
            "poison_calls": 0, "poison_ms": 0.0}


@dataclasses.dataclass
class _Entry:
    key: tuple
    step: runtime.DeviceStep
    captured: bool = False  # launched inside a CUDA graph capture: the graph holds its tables' addresses


class MegakernelDecoder:
    def __init__(self, model: torch.nn.Module, hf_config, max_model_len: int, num_sms: int,
                 max_batch: int = MAX_BATCH, timeout_s: float = 5.0, uniform_routing: bool = False,
                 prebuild: Iterable[int] = ()):
        self.model = model
        self.uniform_routing = uniform_routing  # vLLM's uniform_random routing simulation, in the kernel too
        self.dims = ModelDims.from_config(hf_config)
        self.moe_intermediate = hf_config.intermediate_size
        self.dense_intermediate = getattr(hf_config, "prefix_dense_intermediate_size", None) or 0
        self.attn_layers = [layer.self_attn.attn for layer in model.model.layers]
        self._cache_labels = [f"layer {i}'s KV cache" for i in range(len(self.attn_layers))]  # _inputs' key
        self.num_sms = num_sms
        self.max_batch = max_batch
        self.max_model_len = max_model_len
        self.timeout_s = timeout_s
        self.weights: Weights | None = None
        self.entries: dict[int, _Entry] = {}
        self.schedules = ScheduleCache(lambda batch: build_schedule(self.dims, self._shape(batch),
                                                                    self.moe_intermediate, self.dense_intermediate))
        self.last: runtime.DeviceStep | None = None
        # Captured steps replaced after a buffer moved stay alive: a CUDA graph captured against one still
        # holds the addresses of its tables (vLLM frees its profiling graphs, but nothing tells us when). A
        # step only ever launched eagerly is freed when replaced.
        self.retired: list[runtime.DeviceStep] = []
        # Allocated here, in the model's constructor, so vLLM's memory profiling sees it before it sizes
        # the KV cache; shared by the task lists of every batch size.
        self.workspace = runtime.allocate_workspace(
            self.dims, [(b, self._shape(b).attn_splits) for b in range(1, max_batch + 1)], self.moe_intermediate,
            self.dense_intermediate, device=torch.device("cuda", torch.cuda.current_device()),
        )
        # One stall record for every batch size's step: a CUDA graph replays without running Python, so the step
        # Python launched last (self.last) is not the one that ran; whichever did, a stall lands here.
        self.error = runtime.new_error_record(self.workspace["x"].device)
        self._error_flag_host = torch.zeros(1, dtype=torch.int32, device="cpu", pin_memory=torch.cuda.is_available())
        self.routing_recorded = False
        # What the serving path cost in Python (read by benchmarks.step_profile; a rebuild is logged): launches
        # that ran Python (eager, or a capture), task-table builds (and the part of their time spent getting the
        # size's schedule from the ScheduleCache), and those that replaced a size's tables because vLLM's buffers
        # moved, with their time; the stall check's calls and host time.
        self.stats = new_stats()
        self._rebuilds_logged: set[tuple[int, str]] = set()
        self.schedules.prebuild(b for b in prebuild if b <= max_batch)

    def record_routing(self) -> None:
        """From the next launch on, every step writes each MoE layer's chosen experts to
        :meth:`recorded_routing` (for step-by-step comparisons in eager mode; task lists are rebuilt)."""
        ws = self.workspace
        ws["route_log"] = torch.full((self.dims.num_layers * self.max_batch * self.dims.top_k,), -1,
                                     dtype=torch.int32, device=ws["x"].device)
        self.routing_recorded = True
        self.retired += [e.step for e in self.entries.values() if e.captured]
        self.entries.clear()

    def recorded_routing(self, batch: int) -> torch.Tensor:
        """int32 [num_layers, batch, top_k]: the experts the last launch (of this batch) chose per layer and
        row; -1 on layers without experts."""
        return runtime.routing_log(self.workspace, self.dims, batch)

    def last_routed_experts(self, batch: int) -> float | None:
        """The distinct experts per MoE layer that the last launch of a ``batch``-row step routed, eager or
        replayed (runtime.mean_routed_experts; None if another size ran last), for a speed of light from the
        run's own routing. ``batch`` is the size the step ran at: vLLM's CUDA-graph size for the decode batch."""
        return runtime.mean_routed_experts(self.workspace, self.dims, batch)

    def _shape(self, batch: int) -> StepShape:
        return StepShape(batch=batch, num_sms=self.num_sms)

    # -- which batches
    def eligible(self, input_ids: torch.Tensor | None, inputs_embeds, intermediate_tensors) -> bool:
        if input_ids is None or inputs_embeds is not None or intermediate_tensors is not None:
            return False
        if input_ids.shape[0] > self.max_batch:
            return False
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available():
            return False
        return is_pure_decode(get_forward_context().attn_metadata, input_ids.shape[0])

    # -- the launch
    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        from vllm.forward_context import get_forward_context

        fc = get_forward_context()
        batch = input_ids.shape[0]
        inputs, key = self._inputs(fc, input_ids, positions)
        step = self._step_for(batch, key, lambda: self._build(batch, inputs))
        self.stats["python_launches"] += 1
        runtime.launch(step)
        self.last = step
        return step.out[:batch]

    def _step_for(self, batch: int, key: tuple, build) -> runtime.DeviceStep:
        """The step of this batch size for these buffers (``key``), built by ``build()`` when the size has none
        or its buffers moved. A step launched inside a graph capture is kept alive when replaced (the graph
        reads its tables); one only ever launched eagerly is let go."""
        capturing = torch.cuda.is_current_stream_capturing()
        entry = self.entries.get(batch)
        if entry is None or entry.key != key:
            if capturing:
                raise RuntimeError(
                    f"vllm_megakernel: no task list for batch {batch} matches the buffers being captured; "
                    "vLLM's eager warm-up before capture should have built it"
                )
            if entry is not None and entry.captured:
                self.retired.append(entry.step)
            t0, schedule_ms = time.perf_counter(), self.stats["schedule_ms"]
            new = _Entry(key, build())
            ms = 1000 * (time.perf_counter() - t0)
            self.stats["builds"] += 1
            self.stats["build_ms"] += ms
            if entry is not None:
                self._note_rebuild(batch, entry.key, key, ms)
            else:  # start-up diagnosis: a size's first step, and how much of it waited for its task list
                logger.info("vllm_megakernel: built the batch-%d step in %.1f ms (%.1f ms of it getting its task "
                            "list)", batch, ms, self.stats["schedule_ms"] - schedule_ms)
            entry = new
            self.entries[batch] = entry
        entry.captured |= capturing
        return entry.step

    def _note_rebuild(self, batch: int, old: tuple, new: tuple, ms: float) -> None:
        """Counts a rebuild of a size's tables and logs the first for each (size, cause): outside vLLM's start-up
        (which rebuilds once, after its memory-profiling KV cache goes) one costs the step ``ms`` of host time."""
        self.stats["rebuilds"] += 1
        self.stats["rebuild_ms"] += ms
        cause = key_change(old, new)
        if (batch, cause) not in self._rebuilds_logged:
            self._rebuilds_logged.add((batch, cause))
            logger.info("vllm_megakernel: rebuilt the batch-%d step's task tables in %.1f ms: %s (rebuilds so far: "
                        "%d)", batch, ms, cause, self.stats["rebuilds"])

    def _inputs(self, fc, input_ids, positions) -> tuple[DecodeInputs, tuple]:
        groups: dict[tuple, int] = {}
        group_list: list[KVGroup] = []
        layer_group, caches = [], []
        # (what, value) pairs: a rebuild's log line names the first that changed (key_change)
        key = [("batch", input_ids.shape[0]), ("input_ids", (input_ids.data_ptr(), input_ids.dtype)),
               ("positions", (positions.data_ptr(), positions.dtype))]
        seq_lens = None
        for i, attn in enumerate(self.attn_layers):
            md = fc.attn_metadata[attn.layer_name]
            slot_mapping = fc.slot_mapping.get(attn.layer_name, md.slot_mapping) \
                if isinstance(fc.slot_mapping, dict) else md.slot_mapping
            gkey = (md.block_table.data_ptr(), slot_mapping.data_ptr())
            if gkey not in groups:
                groups[gkey] = len(group_list)
                group_list.append(KVGroup(block_table=md.block_table, slot_mapping=slot_mapping))
                key += [(f"KV-cache group {len(group_list) - 1}'s block table and slot mapping",
                         (gkey, tuple(md.block_table.shape), md.block_table.stride(0), md.block_table.dtype,
                          slot_mapping.dtype))]
            layer_group.append(groups[gkey])
            caches.append(attn.kv_cache)
            key.append((self._cache_labels[i], (attn.kv_cache.data_ptr(), tuple(attn.kv_cache.shape),
                                                attn.kv_cache.stride())))
            if seq_lens is None:
                seq_lens = md.seq_lens
                key += [("seq_lens", (seq_lens.data_ptr(), seq_lens.dtype))]
        inputs = DecodeInputs(input_ids=input_ids, positions=positions, seq_lens=seq_lens, kv_caches=caches,
                              layer_group=layer_group, groups=group_list)
        return inputs, tuple(key)

    def _build(self, batch: int, inputs: DecodeInputs) -> runtime.DeviceStep:
        if self.weights is None:  # after load_weights / process_weights_after_loading: read them in place
            self.weights = Weights.from_vllm_model(self.model)
        t0 = time.perf_counter()
        sched = self.schedules.get(batch)  # waits for the background thread, or builds it here
        self.stats["schedule_ms"] += 1000 * (time.perf_counter() - t0)
        step = runtime.build_step(sched, self.weights, inputs, timeout_s=self.timeout_s,
                                  route_log=self.routing_recorded, workspace=self.workspace,
                                  uniform_routing=self.uniform_routing, error=self.error)
        # The step must read vLLM's buffers themselves, not copies: a copy would freeze one step's inputs.
        read = {k.data_ptr() for k in step.keepalive}
        buffers = [("input_ids", inputs.input_ids), ("positions", inputs.positions), ("seq_lens", inputs.seq_lens)]
        for g in inputs.groups:
            buffers += [("block_table", g.block_table), ("slot_mapping", g.slot_mapping)]
        for name, t in buffers:
            if t.data_ptr() not in read:
                raise RuntimeError(f"vllm_megakernel: vLLM's {name} buffer has an unexpected dtype or layout")
        return step

    # -- stalls never turn into plausible tokens
    def poison_on_error(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """NaN hidden states when a launch gave up on a barrier (device-side, no host sync), and a
        :class:`~vllm_megakernel.megakernel.runtime.MegakernelStallError` naming the stalled task and barrier
        from a flag copied back asynchronously, at the first compute_logits that reads it set: one step later,
        or two under vLLM's async scheduling (which runs the next step's compute_logits while the stalled step
        waits out its timeout). The steps in between are NaN too (the record stays set until the raise), so
        their tokens come from NaN logits (greedy sampling takes token 0), never from a plausible hidden
        state. Every step shares one stall record, so this holds for whichever batch size's graph ran."""
        if self.last is None:  # no step built yet: nothing has run
            return hidden_states
        t0 = time.perf_counter()
        if int(self._error_flag_host[0]):
            runtime.check(stalled_step(self.error, [e.step for e in self.entries.values()] + self.retired,
                                       self.last))  # raises with the whole error record
        self._error_flag_host.copy_(self.error[:1], non_blocking=True)
        failed = self.error[0] != 0
        poisoned = torch.where(failed, torch.full_like(hidden_states, float("nan")), hidden_states)
        # host time only (nothing here waits for the GPU unless the flag's copy does: it would show here)
        self.stats["poison_calls"] += 1
        self.stats["poison_ms"] += 1000 * (time.perf_counter() - t0)
        return poisoned


def key_change(old: tuple, new: tuple) -> str:
    """What differs between two steps' buffer keys (MegakernelDecoder._inputs' (what, value) pairs), in words."""
    for i, ((what, a), (what_new, b)) in enumerate(zip(old, new)):
        if what != what_new:
            return f"the buffers' layout changed at {what_new} (was {what})"
        if a != b:
            more = sum(x != y for x, y in zip(old[i + 1:], new[i + 1:]))
            return f"vLLM's {what} moved or changed shape" + (f" (and {more} more of its buffers)" if more else "")
    return "the number of buffers changed" if len(old) != len(new) else "nothing differs"


def stalled_step(error: torch.Tensor, steps: list[runtime.DeviceStep],
                 default: runtime.DeviceStep) -> runtime.DeviceStep:
    """Which of the steps sharing the stall record ``error`` wrote it: the first (smallest batch) whose schedule
    has the recorded task -- its index, opcode and layer, waiting on the recorded barrier -- on the recorded SM
    (any SM for a claimed expert tile, which runs on whichever SM claims it); ``default`` when none has (the
    error then still names the record's raw fields)."""
    rec = dict(zip(abi.ERROR_FIELDS, error.tolist()))
    for step in sorted(steps, key=lambda st: st.schedule.shape.batch):
        i = rec["task_index"]
        if not 0 <= i < step.schedule.num_tasks:  # before .tasks, which rebuilds a cached schedule's task list
            continue
        tasks = step.schedule.tasks
        t = tasks[i]
        if (int(t.op), t.layer) == (rec["opcode"], rec["layer"]) and rec["barrier"] in (*t.waits, t.load_wait) \
                and (t.sm == rec["sm"] or t.claim != NO_BARRIER):
            return step
    return default

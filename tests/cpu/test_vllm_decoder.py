"""The megakernel inside vLLM: which batches it takes (judged from vLLM's attention metadata), the task lists
built ahead for the capture sizes, and the stall record every batch size's step shares."""

from types import SimpleNamespace

from conftest import FULL_CONFIG, TINY_CONFIG
from vllm_megakernel.megakernel.vllm_decoder import is_pure_decode, unsupported_model_reasons


def md(max_query_len=1, use_cascade=False, rows=None):
    import torch

    rows_of = {} if rows is None else {"seq_lens": torch.zeros(rows, dtype=torch.int32),
                                       "block_table": torch.zeros(rows, 4, dtype=torch.int32)}
    return SimpleNamespace(max_query_len=max_query_len, use_cascade=use_cascade, **rows_of)


def test_pure_decode_needs_one_query_token_everywhere_and_no_cascade():
    assert is_pure_decode({"a": md(), "b": md()})
    assert not is_pure_decode({"a": md(), "b": md(max_query_len=7)})  # a prefill or mixed batch
    assert not is_pure_decode({"a": md(use_cascade=True)})
    assert not is_pure_decode(None)  # profiling and dummy runs
    assert not is_pure_decode({})
    assert not is_pure_decode([{"a": md()}])  # dual-batch overlap hands a list


def test_a_decode_batch_padded_past_its_attention_metadata_runs_on_stock():
    """Under a FULL graph vLLM pads the metadata with the input ids (padding rows: seq_len 0, the null block);
    under a PIECEWISE graph it pads only the input ids: 12 requests padded to 16 rows keep 12-row seq_lens and
    block-table views, whose rows 12-15 the kernel would read from stale or foreign memory."""
    assert is_pure_decode({"a": md(rows=16), "b": md(rows=16)}, batch=16)
    assert is_pure_decode({"a": md(rows=16)}, batch=12)  # an eager batch reading a prefix of larger buffers
    assert not is_pure_decode({"a": md(rows=16), "b": md(rows=12)}, batch=16)
    assert not is_pure_decode({"a": md()}, batch=1)  # metadata without the buffers: not ours to launch on


def test_north_mini_code_fits_the_kernel_and_the_tiny_config_does_not():
    from transformers import AutoConfig

    assert unsupported_model_reasons(AutoConfig.from_pretrained(FULL_CONFIG)) == []
    reasons = unsupported_model_reasons(AutoConfig.from_pretrained(TINY_CONFIG))
    assert any("hidden=64" in r for r in reasons)


def test_shared_workspace_fits_every_batch_up_to_its_size_and_refuses_larger():
    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel import runtime

    from vllm_megakernel.megakernel import layout

    dims = ref.ModelDims.from_config(FULL_CONFIG)
    steps = [(b, layout.attn_splits_for(b, 132)) for b in range(1, 65)]
    ws = runtime.allocate_workspace(dims, steps, 768, 3072, device="meta")
    nbytes = sum(t.numel() * t.element_size() for t in ws.values())
    assert nbytes < 1 << 30  # DESIGN: the megakernel's own buffers stay under 1 GiB at batch 64
    small = runtime.allocate_workspace(dims, steps[16:17], 768, 3072, device="meta")
    assert all(small[k].numel() <= ws[k].numel() for k in ws)
    big = runtime.allocate_workspace(dims, [(65, 3)], 768, 3072, device="meta")
    assert any(big[k].numel() > ws[k].numel() for k in ws)
    assert all(t.device.type == "meta" for t in ws.values())  # sizes only: nothing was allocated


def test_batch_limit_never_exceeds_the_largest_cuda_graph():
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CUDAGraphMode

    from vllm_megakernel.megakernel.vllm_decoder import MAX_BATCH, batch_limit

    graphs = CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE, max_cudagraph_capture_size=16)
    assert batch_limit(graphs) == 16
    big = CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY, max_cudagraph_capture_size=512)
    assert batch_limit(big) == MAX_BATCH
    eager = CompilationConfig(cudagraph_mode=CUDAGraphMode.NONE, max_cudagraph_capture_size=16)
    assert batch_limit(eager) == MAX_BATCH  # no graphs: every decode batch runs eagerly anyway


def _recording_cache(gate=None, fail=()):
    """A ScheduleCache whose builds record (batch, thread) and return a stand-in schedule; batch 64's build waits
    on ``gate`` when given, and sizes in ``fail`` raise."""
    import threading

    from vllm_megakernel.megakernel.vllm_decoder import ScheduleCache

    calls = []

    class Built:  # what ScheduleCache keeps of a schedule (schedule.EncodedSchedule) reads these
        def __init__(self, batch):
            self.batch = batch
            self.dims = self.tiles = None
            self.shape = ("shape", batch)
            self.num_slots = self.combine_heads = self.num_tasks = self.num_barriers = batch
            self.route_post_words = self.score_post_words = 0
            self.sm_task_counts = (batch,)

        def encode(self):
            return ("encoded", self.batch)

    def build(batch):
        calls.append((batch, threading.current_thread().name))
        if gate is not None and batch == 64:
            assert gate.wait(10)
        if batch in fail:
            raise ValueError(f"no schedule for batch {batch}")
        return Built(batch)

    return ScheduleCache(build), calls


def test_capture_sizes_are_built_once_on_a_background_thread_largest_first():
    import threading

    cache, calls = _recording_cache()
    cache.prebuild([1, 8, 64, 8])
    for thread in threading.enumerate():  # let it finish, so that no get() below takes a size over
        if thread.name == "vllm_megakernel-schedules":
            thread.join(10)
    for b in (64, 8, 1):
        sched = cache.get(b)
        assert sched.shape == ("shape", b) and sched.encode() == ("encoded", b)
    assert cache.get(64) is cache.get(64)  # kept: vLLM's rebuild after its profiling capture reuses it
    assert calls == [(64, "vllm_megakernel-schedules"), (8, "vllm_megakernel-schedules"),
                     (1, "vllm_megakernel-schedules")]
    cache.get(3)  # a size nobody asked for ahead (an eager decode batch): built by the caller
    assert calls[-1][0] == 3 and calls[-1][1] != "vllm_megakernel-schedules"


def test_a_size_the_thread_has_not_reached_is_built_by_its_caller_and_a_failed_build_raises_there():
    import threading

    import pytest

    gate = threading.Event()  # holds the background thread inside its first build (64)
    cache, calls = _recording_cache(gate, fail=(2,))
    cache.prebuild([64, 16, 2])
    for _ in range(10_000):
        if calls:
            break
        threading.Event().wait(0.001)
    sched = cache.get(16)  # queued behind 64: built here rather than after it
    assert sched.shape == ("shape", 16) and calls[-1] == (16, threading.current_thread().name)
    gate.set()
    assert cache.get(64).shape == ("shape", 64)
    with pytest.raises(ValueError, match="no schedule for batch 2"):
        cache.get(2)
    assert sorted(b for b, _ in calls) == [2, 16, 64]  # every size built once


def test_prebuilt_sizes_are_the_full_decode_graphs_up_to_the_batch_limit():
    from vllm.config.compilation import CUDAGraphMode

    from vllm_megakernel.megakernel.vllm_decoder import prebuilt_batches

    sizes = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 128]
    cc = lambda mode: SimpleNamespace(cudagraph_mode=mode, cudagraph_capture_sizes=sizes)  # noqa: E731
    seqs = SimpleNamespace(max_num_seqs=64)
    assert prebuilt_batches(cc(CUDAGraphMode.FULL_AND_PIECEWISE), seqs, 64) == sizes[:11]
    assert prebuilt_batches(cc(CUDAGraphMode.FULL_DECODE_ONLY), SimpleNamespace(max_num_seqs=8), 64) == [1, 2, 4, 8]
    assert prebuilt_batches(cc(CUDAGraphMode.FULL_AND_PIECEWISE), seqs, 16) == [1, 2, 4, 8, 16]
    assert prebuilt_batches(cc(CUDAGraphMode.PIECEWISE), seqs, 64) == []  # decode runs eagerly, at its own sizes
    assert prebuilt_batches(cc(CUDAGraphMode.NONE), seqs, 64) == []


def _stall_in(step, task, record):
    """What the kernel writes when ``task`` of ``step`` times out (barrier.cuh's record)."""
    from vllm_megakernel.megakernel import abi

    values = {"flag": 1, "sm": task.sm, "task_index": task.index, "opcode": int(task.op), "layer": task.layer,
              "barrier": task.waits[0], "expected": 5, "seen": 4}
    for name, v in values.items():
        record[abi.ERROR_FIELDS.index(name)] = v


def test_a_stall_in_any_batch_sizes_graph_poisons_and_names_that_step_not_the_last_one_python_launched():
    """Under FULL CUDA graphs Python launches each size once, at capture (largest first), and the replays run
    no Python: the decoder's `last` step is batch 1's while batch 8's graph runs. Every step shares one stall
    record, so a stall in batch 8's step poisons the hidden states at once and raises naming batch 8's task."""
    import pytest
    import torch

    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel import runtime
    from vllm_megakernel.megakernel.schedule import StepShape, build_schedule
    from vllm_megakernel.megakernel.vllm_decoder import MegakernelDecoder, _Entry, new_stats

    dims = ref.ModelDims.from_config(TINY_CONFIG)
    record = runtime.new_error_record("cpu")
    steps = {b: SimpleNamespace(schedule=build_schedule(dims, StepShape(batch=b, num_sms=4), 32, 64), error=record)
             for b in (8, 4, 1)}  # captured largest first: batch 1's step is the last Python launched
    dec = object.__new__(MegakernelDecoder)
    dec.entries = {b: _Entry((b,), s) for b, s in steps.items()}
    dec.retired, dec.last, dec.error, dec.stats = [], steps[1], record, new_stats()
    dec._error_flag_host = torch.zeros(1, dtype=torch.int32)
    hidden = torch.ones(8, 16)
    assert torch.equal(dec.poison_on_error(hidden), hidden)  # no stall: untouched

    victim = next(t for t in steps[8].schedule.tasks if t.waits and t.layer == 1 and t.op.name == "MOE_DOWN")
    _stall_in(steps[8], victim, record)  # batch 8's graph replayed and stalled
    assert torch.isnan(dec.poison_on_error(hidden)).all()  # the same step's logits: NaN, no host sync
    with pytest.raises(runtime.MegakernelStallError, match=rf"in the batch-8 step: task {victim.index} \(MOE_DOWN"):
        dec.poison_on_error(hidden)  # the next step reads the flag copied back and raises
    assert dec.stats["poison_calls"] == 2  # the raising call is not counted
    assert record.tolist()[:2] == [0, -1]  # cleared for the next report


def test_the_step_that_stalled_is_the_one_whose_schedule_has_the_recorded_task_on_the_recorded_sm():
    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel import runtime
    from vllm_megakernel.megakernel.schedule import StepShape, build_schedule
    from vllm_megakernel.megakernel.vllm_decoder import stalled_step

    dims = ref.ModelDims.from_config(TINY_CONFIG)
    steps = [SimpleNamespace(schedule=build_schedule(dims, StepShape(batch=b, num_sms=5), 32, 64)) for b in (2, 17)]
    record = runtime.new_error_record("cpu")
    big = steps[1].schedule.tasks
    task = next(t for t in big[len(steps[0].schedule.tasks):] if t.waits)  # past batch 2's last task
    _stall_in(steps[1], task, record)
    assert stalled_step(record, steps, default=steps[0]) is steps[1]
    record[1] = (task.sm + 1) % 5  # no step has that task on that SM: the caller's default
    assert stalled_step(record, steps, default=steps[0]) is steps[0]
    record[1] = task.sm
    record[5] = max(task.waits) + 1  # nor that task waiting on another barrier
    assert stalled_step(record, steps, default=steps[0]) is steps[0]
    # a claimed expert tile runs on whichever SM claims it: the recorded SM is not the one it was dealt to
    claimed = [SimpleNamespace(schedule=build_schedule(dims, StepShape(batch=b, num_sms=5, expert_claims=True), 32,
                                                       64)) for b in (2, 17)]
    down = next(t for t in claimed[1].schedule.tasks[len(claimed[0].schedule.tasks):] if t.op.name == "MOE_DOWN")
    _stall_in(claimed[1], down, record)
    record[1] = (down.sm + 2) % 5
    assert stalled_step(record, claimed, default=claimed[0]) is claimed[1]


def test_every_step_the_decoder_builds_shares_its_one_stall_record(tiny_checkpoint):
    import torch

    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel import runtime
    from vllm_megakernel.megakernel.schedule import StepShape, build_schedule
    from vllm_megakernel.megakernel.vllm_decoder import MegakernelDecoder, ScheduleCache, new_stats
    from vllm_megakernel.paged_kv import PagedKVSim

    dims = ref.ModelDims.from_config(TINY_CONFIG)
    w = ref.Weights.from_checkpoint(tiny_checkpoint, dims, dtype=torch.bfloat16)
    dec = object.__new__(MegakernelDecoder)  # the decoder's state without a GPU or a vLLM model
    dec.weights, dec.timeout_s, dec.routing_recorded, dec.uniform_routing = w, 1.0, False, False
    dec.stats = new_stats()
    dec.schedules = ScheduleCache(lambda b: build_schedule(dims, StepShape(batch=b, num_sms=4), *w.intermediates()))
    dec.workspace = runtime.allocate_workspace(dims, [(b, StepShape(batch=b, num_sms=4).attn_splits) for b in (2, 3)],
                                               *w.intermediates(), device="cpu", dtype=torch.bfloat16)
    dec.error = runtime.new_error_record("cpu")
    sim = PagedKVSim(dims, num_requests=3, max_len=20, block_size=4, dtype=torch.bfloat16)
    sim.fill_history([5, 9, 3], generator=torch.Generator().manual_seed(0))
    steps = []
    for rows in ([1, 2], [1, 2, 3]):
        inp = sim.step(rows)
        inp.input_ids, inp.seq_lens = inp.input_ids.to(torch.int32), inp.seq_lens.to(torch.int32)  # vLLM's dtypes
        steps.append(dec._build(len(rows), inp))
    assert [s.schedule.shape.batch for s in steps] == [2, 3] and all(s.error is dec.error for s in steps)
    assert dec.stats["schedule_ms"] > 0  # both schedules were built by these calls (no background thread here)


def test_building_a_task_list_makes_no_cuda_call(monkeypatch):
    """The background thread builds while vLLM may be capturing a CUDA graph on the main thread, where any CUDA
    call from another thread breaks the capture: building and encoding touch no CUDA at all."""
    import torch

    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel.schedule import StepShape, build_schedule
    from vllm_megakernel.megakernel.vllm_decoder import ScheduleCache

    def no_cuda(*args, **kwargs):
        raise AssertionError("a CUDA call while building a task list")

    for name in ("_lazy_init", "current_device", "synchronize", "current_stream", "is_available"):
        monkeypatch.setattr(torch.cuda, name, no_cuda)
    dims = ref.ModelDims.from_config(TINY_CONFIG)
    encoded = ScheduleCache(lambda b: build_schedule(dims, StepShape(batch=b, num_sms=4), 32, 64)).get(3).encode()
    assert encoded.device.type == "cpu" and encoded.shape[0] == 4


def test_a_replaced_step_is_kept_alive_only_if_a_graph_captured_it(monkeypatch):
    """A step whose buffers moved is rebuilt; the old one stays alive only if a CUDA graph captured it (the
    graph reads its tables), so eager rebuilds do not pile up device memory; no step is built mid-capture."""
    import pytest
    import torch

    from vllm_megakernel.megakernel.vllm_decoder import MegakernelDecoder, new_stats

    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    dec = object.__new__(MegakernelDecoder)
    dec.entries, dec.retired, dec._rebuilds_logged = {}, [], set()
    dec.stats = new_stats()
    built = []

    def build():
        built.append(SimpleNamespace(n=len(built)))
        return built[-1]

    eager = dec._step_for(8, (("kv cache", "warm-up"),), build)
    assert dec._step_for(8, (("kv cache", "real"),), build) is built[1] and dec.retired == []  # eager only: let go
    capturing[0] = True
    assert dec._step_for(8, (("kv cache", "real"),), build) is built[1]  # the capture launches the same step
    capturing[0] = False
    dec._step_for(8, (("kv cache", "moved"),), build)
    assert dec.retired == [built[1]] and eager not in dec.retired and len(built) == 3
    capturing[0] = True
    with pytest.raises(RuntimeError, match="no task list for batch 4 matches the buffers being captured"):
        dec._step_for(4, (("kv cache", "anything"),), build)


def _stall_in_graph_script():
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("stall_in_graph", REPO / "tests" / "gpu" / "stall_in_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_any_task_the_gpu_stall_tests_victim_holds_up_is_reported_as_batch_8s_among_the_captured_sizes():
    """tests/gpu/test_stall_reporting_in_vllm.py accepts a report of the victim or of any task it holds up (the
    first wait to time out is a race: the timing model puts the next layer's QKV and the victim within ~3 us).
    With the engine's captured sizes side by side (its 5-layer model on 132 SMs), each such report must name
    batch 8's step, and the held-up set must hold the victim's waiters and none of what the victim waits for."""
    from transformers import AutoConfig

    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel import runtime
    from vllm_megakernel.megakernel.abi import NO_BARRIER
    from vllm_megakernel.megakernel.schedule import StepShape, build_schedule
    from vllm_megakernel.megakernel.vllm_decoder import stalled_step

    script = _stall_in_graph_script()
    hf = AutoConfig.from_pretrained(FULL_CONFIG)
    hf.num_hidden_layers, hf.layer_types = 5, hf.layer_types[:5]  # the GPU test's shallow checkpoint
    dims = ref.ModelDims.from_config(hf)
    dense = getattr(hf, "prefix_dense_intermediate_size", None) or 0
    steps = {b: SimpleNamespace(schedule=build_schedule(dims, StepShape(batch=b, num_sms=132), hf.intermediate_size,
                                                        dense)) for b in (1, 2, 4, 8)}
    s = steps[8].schedule
    victim = script.pick_victim(s)
    held = script.held_up_by(s, victim.index)
    assert victim.index in held
    assert {t.index for t in s.tasks if victim.signal in t.waits} <= held
    upstream = {t.index for t in s.tasks if t.signal in victim.waits}
    assert upstream and not upstream & held
    assert all(s.tasks[i].layer >= 1 for i in held) and any(s.tasks[i].layer == 4 for i in held)

    held_barriers = {s.tasks[i].signal for i in held} - {NO_BARRIER}
    record = runtime.new_error_record("cpu")
    reporters = 0
    for i in sorted(held):
        t = s.tasks[i]
        stuck_on = [b for b in (*t.waits, t.load_wait) if b in held_barriers or (i == victim.index and b == t.waits[0])]
        if not stuck_on:
            continue  # held up only behind a task of its own SM: never reached, never reports
        reporters += 1
        _stall_in(steps[8], t, record)
        record[5] = stuck_on[0]
        assert stalled_step(record, list(steps.values()), default=steps[1]) is steps[8], t.describe()
    assert reporters > 100


def test_a_rebuild_of_a_sizes_tables_after_its_buffers_moved_is_counted_and_logged_once_per_cause(caplog, monkeypatch):
    """A changed buffer key rebuilds the size's tables on the serving thread: that costs the step its host time,
    so it is counted (stats, read by step_profile) and logged with what moved, once per size and cause; a size's
    first build is logged once."""
    import logging

    import pytest

    import torch

    from vllm_megakernel.megakernel.vllm_decoder import MegakernelDecoder, key_change, new_stats

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    from vllm_megakernel.megakernel import vllm_decoder

    ticks = iter(range(0, 10_000, 5))  # every perf_counter read 5 ms after the last
    monkeypatch.setattr(vllm_decoder.time, "perf_counter", lambda: next(ticks) / 1000)
    dec = object.__new__(MegakernelDecoder)
    dec.entries, dec.retired, dec._rebuilds_logged = {}, [], set()
    dec.stats = new_stats()
    first = (("batch", 1), ("input_ids", (100, torch.int32)), ("layer 0's KV cache", (200, (2, 16), (1,))))
    moved = first[:2] + (("layer 0's KV cache", (300, (2, 16), (1,))),)
    built = []

    def build():
        built.append(1)
        return SimpleNamespace(schedule=None)

    with caplog.at_level(logging.INFO, logger="vllm.megakernel"):
        a = dec._step_for(1, first, build)
        assert dec._step_for(1, first, build) is a and len(built) == 1  # same buffers: no build
        b = dec._step_for(1, moved, build)
        dec._step_for(1, first, build)
        dec._step_for(1, moved, build)
    assert b is not a and len(built) == 4
    assert dec.stats["builds"] == 4 and dec.stats["rebuilds"] == 3
    # the clock below reads 5 ms later each time: 5 ms a build
    assert dec.stats["build_ms"] == pytest.approx(4 * 5.0) and dec.stats["rebuild_ms"] == pytest.approx(3 * 5.0)
    lines = [r.getMessage() for r in caplog.records if "rebuilt" in r.getMessage()]
    assert len(lines) == 1 and "batch-1 step" in lines[0] and "layer 0's KV cache moved" in lines[0], lines
    # the size's first build is logged too (start-up diagnosis), with the part of it spent on the schedule
    first_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("vllm_megakernel: built")]
    assert first_lines == ["vllm_megakernel: built the batch-1 step in 5.0 ms (0.0 ms of it getting its task list)"]
    assert key_change(first, first) == "nothing differs"
    assert key_change(first, first[:2]) == "the number of buffers changed"
    assert "layout changed at seq_lens" in key_change(first, first[:2] + (("seq_lens", (1, None)),))
    both = (("input_ids", (101, torch.int32)), moved[2])
    assert key_change(first, first[:1] + both) == "vLLM's input_ids moved or changed shape (and 1 more of its buffers)"


def test_the_cache_keeps_a_schedule_without_its_tasks_and_rebuilds_them_identical_on_demand():
    """ScheduleCache keeps what a step needs of a schedule (schedule.EncodedSchedule), not its Task objects (the
    full model's cost ~1.8 GB and every garbage collection a walk over ~3M objects at vLLM's 11 capture sizes);
    a stall report or a trace that asks for the tasks gets them rebuilt, encoding to the same tables, once; a
    rebuild that comes out different is refused."""
    import gc

    import pytest
    import torch

    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel.schedule import EncodedSchedule, StepShape, Task, build_schedule
    from vllm_megakernel.megakernel.vllm_decoder import ScheduleCache

    dims = ref.ModelDims.from_config(TINY_CONFIG)
    builds = []

    def build(b):
        builds.append(b)
        return build_schedule(dims, StepShape(batch=b, num_sms=4), 32, 64)

    def live_tasks():
        return sum(type(o) is Task for o in gc.get_objects())

    before = live_tasks()
    sched = ScheduleCache(build).get(3)
    encoded = sched.encode()
    assert isinstance(sched, EncodedSchedule) and builds == [3]
    assert live_tasks() == before  # the task list went with the build
    full = build(3)
    assert (sched.shape, sched.num_tasks, sched.num_barriers, sched.sm_task_counts, sched.num_slots) == \
        (full.shape, len(full.tasks), len(full.barriers), tuple(map(len, full.sm_tasks)), full.num_slots)
    del full
    builds.clear()
    tasks = sched.tasks  # a stall report's lookup: rebuilt (and checked to encode to `encoded`) once
    assert builds == [3] and len(tasks) == sched.num_tasks and sched.barrier_name(0) == sched.barriers[0].name
    assert sched.sm_tasks and sched.encode() is encoded and builds == [3]

    # a rebuild that does not encode to the tables the kernel ran is refused: here the same shape on other SMs
    # (same counts of tasks and barriers, other places)
    three = build_schedule(dims, StepShape(batch=3, num_sms=4), 32, 64)
    moved = EncodedSchedule(three, three.encode().roll(1, dims=0), lambda: build_schedule(dims, three.shape, 32, 64))
    with pytest.raises(RuntimeError, match="batch-3 schedule rebuilt differs"):
        moved.tasks

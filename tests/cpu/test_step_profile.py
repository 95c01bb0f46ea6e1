"""benchmarks.step_profile's reading of a torch profiler trace (the GPU run is the tool itself)."""

import json
from types import SimpleNamespace

import pytest

from benchmarks import step_profile


def _trace(events):
    return {"traceEvents": events + [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 999},
                                     {"ph": "i", "cat": "kernel", "name": "marker", "ts": 5}]}


def test_gpu_time_is_summed_per_kernel_and_per_step():
    """Per kernel: calls, time per call and per step; busy = the sum of GPU events, span = first start to
    last end; CPU ops and instant events are not GPU time."""
    events = [{"ph": "X", "cat": "kernel", "name": "decode_kernel", "ts": 100 + 1000 * i, "dur": 800} for i in range(4)]
    events += [{"ph": "X", "cat": "kernel", "name": "gemm_lm_head", "ts": 900 + 1000 * i, "dur": 90} for i in range(4)]
    events += [{"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 95 + 1000 * i, "dur": 2}
               for i in range(4)]
    got = step_profile.summarize(step_profile.gpu_events(_trace(events)), steps=4)
    assert [r["name"] for r in got["kernels"]] == ["decode_kernel", "gemm_lm_head", "Memset (Device)"]
    assert got["kernels"][0] == {"name": "decode_kernel", "calls": 4, "us_per_call": 800.0, "us_per_step": 800.0}
    assert got["busy_us_per_step"] == pytest.approx(892.0)
    assert got["span_us_per_step"] == pytest.approx((3990 - 95) / 4)


def test_kernels_past_the_row_limit_fold_into_one_row_and_nothing_is_lost():
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": i * 10, "dur": 10 - i} for i in range(6)]
    got = step_profile.summarize(events, steps=2, rows=3)
    assert [r["name"] for r in got["kernels"]] == ["k0", "k1", "k2", "other (3 kernels)"]
    assert sum(r["us_per_step"] for r in got["kernels"]) == pytest.approx(got["busy_us_per_step"])


def test_an_empty_trace_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="no GPU events"):
        step_profile.summarize(step_profile.gpu_events(_trace([])), steps=4)


def test_the_trace_is_found_only_when_there_is_exactly_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="expected one"):
        step_profile.find_trace(tmp_path)
    (tmp_path / "w.1.pt.trace.json").write_text("{}")
    assert step_profile.find_trace(tmp_path).name == "w.1.pt.trace.json"
    (tmp_path / "w.2.pt.trace.json").write_text("{}")
    with pytest.raises(FileNotFoundError):
        step_profile.find_trace(tmp_path)


def test_the_table_shows_each_side_and_says_when_one_did_not_run():
    events = [{"ph": "X", "cat": "kernel", "name": "a|b", "ts": 0, "dur": 50}]
    result = {"batch": 8, "context": 8192, "steps": 1, "sides": {
        "stock": {"error": "the stock worker exited 1; see its output above"},
        "megakernel": {"wall_ms_per_step": 8.8, "decision": "runs on the megakernel",
                       "profile": step_profile.summarize(events, steps=1)}}}
    text = step_profile.markdown(result)
    assert "## stock" in text and "did not run: the stock worker exited 1" in text
    assert "step wall time without the profiler: 8.800 ms" in text and "| a\\|b | 1 | 50.0 | 50.0 |" in text
    json.dumps(result)  # what profile.json holds


def test_the_prefill_table_gives_both_timings():
    events = [{"ph": "X", "cat": "kernel", "name": "fused_moe_kernel", "ts": 0, "dur": 40}]
    result = {"batch": 1, "context": 1024, "steps": 2, "phase": "prefill", "sides": {
        "stock": {"wall_ms_per_step": 45.0, "prefill_ms": [45.0, 44.0], "first_token_ms": [50.0, 52.0, 51.0],
                  "decision": "stock", "engine_init_s": 50.2, "profile": step_profile.summarize(events, steps=2)}}}
    text = step_profile.markdown(result)
    assert text.startswith("2 profiled prefills of 1 fresh prompt(s) of 1024 tokens per side")
    assert "one-token requests without the profiler 45.000 ms (min 44.000)" in text
    assert "go on decoding 51.000 ms (min 50.000)" in text and "GPU busy per profiled prefill 0.020 ms" in text
    assert "Engine start-up 50 s." in text
    result["sides"]["megakernel"] = {
        **result["sides"]["stock"], "decision": "megakernel",
        "decoder_during_first_token_units": {"python_launches": 2, "builds": 3, "build_ms": 71.5, "rebuilds": 2,
                                             "rebuild_ms": 61.5, "poison_calls": 18, "poison_ms": 0.9},
        "decoder_during_prefill_units": {"python_launches": 0, "builds": 0, "build_ms": 0.0, "rebuilds": 0,
                                         "rebuild_ms": 0.0, "poison_calls": 2, "poison_ms": 0.1}}
    text = step_profile.markdown(result)
    assert ("During the first-token units the megakernel decoder ran Python for 2 launches, built tables 3 times "
            "(71.5 ms), 2 of them rebuilds (61.5 ms); its stall check took 0.9 ms of host time over 18 calls.") in text
    assert "During the one-token units the megakernel decoder ran Python for 0 launches" in text


class _FakeEngine:
    """Each request's first token comes out of the step after the one that admitted it."""

    def __init__(self, log):
        self.log, self.pending, self.live = log, [], {}

    def add_request(self, rid, prompt, params):
        self.log.append(("add", rid, tuple(prompt["prompt_token_ids"]), params.max_tokens, params.temperature,
                         params.seed))
        self.pending.append(rid)

    def step(self):
        out = [SimpleNamespace(request_id=r, outputs=[SimpleNamespace(token_ids=[7])]) for r in self.live]
        self.live = {r: 0 for r in self.pending}
        self.pending = []
        return out

    def has_unfinished_requests(self):
        return bool(self.live or self.pending)


def test_prefill_units_use_prompts_the_prefix_cache_never_saw_and_profile_one_token_requests(tmp_path):
    log = []
    engine = _FakeEngine(log)
    from vllm_megakernel.megakernel.vllm_decoder import new_stats

    stats = new_stats()
    model = SimpleNamespace(megakernel=SimpleNamespace(stats=stats))
    stepped = engine.step

    def step():  # a decoder that runs Python on every engine step, and rebuilds on every third
        stats["python_launches"] += 1
        if stats["python_launches"] % 3 == 0:
            stats["rebuilds"] += 1
            stats["rebuild_ms"] += 10.0
        return stepped()

    engine.step = step
    llm = SimpleNamespace(llm_engine=engine, start_profile=lambda: log.append(("start",)),
                          stop_profile=lambda: log.append(("stop",)), apply_model=lambda f: [f(model)])
    args = SimpleNamespace(batch=2, context=16, seed=3, steps=3, worker="stock", out=tmp_path / "side.json")
    step_profile._prefill_worker(args, llm, {"decision": "stock"})
    adds = [e for e in log if e[0] == "add"]
    assert len(adds) == 2 * (2 * 2 + 3 * 3)  # two warm-up pairs, then first-token, one-token and profiled units
    assert len({e[2] for e in adds}) == len(adds)  # no prompt twice: every unit prefills all of its tokens
    start, stop = log.index(("start",)), log.index(("stop",))
    profiled = [e for e in log[start:stop] if e[0] == "add"]
    assert len(profiled) == 2 * 3 and {e[3] for e in profiled} == {1}
    assert step_profile.FIRST_TOKEN_NEW_TOKENS > 1
    assert {e[3] for e in adds[8:14]} == {step_profile.FIRST_TOKEN_NEW_TOKENS}
    side = json.loads(args.out.read_text())
    assert len(side["first_token_ms"]) == len(side["prefill_ms"]) == 3 and side["decision"] == "stock"
    first, alone = side["decoder_during_first_token_units"], side["decoder_during_prefill_units"]
    assert first["python_launches"] + alone["python_launches"] < stats["python_launches"]  # the warm-ups are out
    assert first["python_launches"] > 0 and first["rebuilds"] >= 1 and first["rebuild_ms"] == 10.0 * first["rebuilds"]
    assert alone["rebuilds"] >= 1 and alone["rebuild_ms"] == 10.0 * alone["rebuilds"]
    assert step_profile.stats_delta(None, stats) is None  # a stock engine has no decoder


def test_both_phases_share_one_engine_and_each_keeps_its_own_trace_and_figures(tmp_path, monkeypatch):
    """--phase decode,prefill: one engine, the decode phase first at --batch, the prefill units at
    --prefill-batch; each phase's trace moves into its own folder before the next phase profiles, so the
    orchestrator reads each phase's kernels from its own trace."""
    log, traces = [], tmp_path / "trace"
    traces.mkdir()

    def stop():
        log.append(("stop",))
        (traces / f"w.{len([e for e in log if e == ('stop',)])}.pt.trace.json").write_text("{}")

    llm = SimpleNamespace(llm_engine=_FakeEngine(log), start_profile=lambda: log.append(("start",)), stop_profile=stop,
                          apply_model=lambda f: [f(SimpleNamespace())])  # stock: no megakernel decoder
    monkeypatch.setattr(step_profile, "_decode_worker", lambda args, llm, info: (
        llm.start_profile(), llm.stop_profile(),
        step_profile.write_json_atomic(args.out, {"phase": "decode", "batch": args.batch})))
    args = SimpleNamespace(batch=8, prefill_batch=1, context=16, seed=3, steps=2, worker="stock",
                           out=tmp_path / "stock.json", phase="decode,prefill")
    step_profile.run_phases(args, llm, {"decision": "stock"}, traces)
    decode = json.loads((tmp_path / "stock-decode.json").read_text())
    prefill = json.loads((tmp_path / "stock-prefill.json").read_text())
    assert decode == {"phase": "decode", "batch": 8} and len(prefill["prefill_ms"]) == 2
    assert {len(e[2]) for e in log if e[0] == "add"} == {16}
    assert len([e for e in log if e[0] == "add"]) == 1 * (2 * 2 + 3 * 2)  # prefill units of one prompt each
    assert step_profile.find_trace(traces / "decode").name == "w.1.pt.trace.json"
    assert step_profile.find_trace(traces / "prefill").name == "w.2.pt.trace.json"
    assert not list(traces.glob("*.pt.trace.json"))


def test_a_phase_whose_worker_died_before_its_figures_is_an_error_and_the_other_phase_stands(tmp_path):
    trace_dir = tmp_path / "stock-trace"
    (trace_dir / "decode").mkdir(parents=True)
    (trace_dir / "decode" / "w.pt.trace.json").write_text(json.dumps(_trace(
        [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 10}])))
    (tmp_path / "stock-decode.json").write_text(json.dumps({"wall_ms_per_step": 9.0, "decision": "stock"}))
    decode = step_profile.read_side(tmp_path / "stock-decode.json", trace_dir / "decode", 1, 25, 1, "stock")
    prefill = step_profile.read_side(tmp_path / "stock-prefill.json", trace_dir / "prefill", 1, 25, 1, "stock")
    assert decode["profile"]["busy_us_per_step"] == 10.0
    assert prefill == {"error": "the stock worker exited 1 before this phase's figures; see its output above"}


@pytest.mark.parametrize("phase", ["", "decode,decode", "prefill,warmup"])
def test_a_phase_list_with_an_unknown_or_repeated_phase_is_refused(phase, capsys):
    with pytest.raises(SystemExit):
        step_profile.main(["--model", "m", "--phase", phase])
    assert "--phase" in capsys.readouterr().err


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_decode_phase_samples_as_the_sweep_does_each_request_with_a_seed_of_its_own(tmp_path, temperature):
    """--temperature: greedy at 0; above 0 every request of the batch samples with its own seed (decode_sweep's
    sampling_params: the same seeds on both sides and in every run, so the profiled steps draw what the timed
    ones drew), each request asking for decode_new_tokens(steps) tokens either way."""
    log = []
    llm = SimpleNamespace(llm_engine=_FakeEngine(log), start_profile=lambda: log.append(("start",)),
                          stop_profile=lambda: log.append(("stop",)))
    args = SimpleNamespace(batch=4, context=16, seed=3, steps=2, temperature=temperature, worker="stock",
                           out=tmp_path / "stock-decode.json")
    step_profile._decode_worker(args, llm, {"decision": "stock"})
    adds = [e for e in log if e[0] == "add"]
    assert len(adds) == 3 * 4  # the warm-up, the timed and the profiled run, the whole batch each
    runs = [adds[i:i + 4] for i in range(0, len(adds), 4)]
    assert {e[3] for e in adds} == {step_profile.decode_new_tokens(2)}
    assert {e[4] for e in adds} == {temperature}
    seeds = [[e[5] for e in run] for run in runs]
    if temperature == 0:
        assert {s for run in seeds for s in run} == {None}
    else:
        assert len(set(seeds[0])) == 4 and seeds[0] == seeds[1] == seeds[2]
    assert json.loads(args.out.read_text())["side"] == "stock"


def test_each_side_worker_gets_the_runs_temperature(tmp_path):
    args = SimpleNamespace(model="m", load_format="dummy", batch=8, context=1024, steps=32, gpu_memory_utilization=0.9,
                           seed=0, temperature=1.0, phase="decode", prefill_batch=8)
    cmd = step_profile.worker_command(args, "megakernel", tmp_path / "t", tmp_path / "megakernel.json")
    assert cmd[cmd.index("--worker") + 1] == "megakernel"
    assert cmd[cmd.index("--temperature") + 1] == "1.0"


def test_a_negative_temperature_is_refused(capsys):
    with pytest.raises(SystemExit):
        step_profile.main(["--model", "m", "--temperature", "-0.5"])
    assert "--temperature" in capsys.readouterr().err


def test_the_table_says_when_the_decode_steps_sampled():
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 10}]
    side = {"wall_ms_per_step": 9.0, "decision": "stock", "profile": step_profile.summarize(events, steps=1)}
    result = {"steps": 1, "batch": 8, "context": 1024, "sides": {"stock": side}}
    assert "sampled" not in step_profile.markdown(result)  # written before the key: greedy
    result["sampling"] = "temperature 1, a seed per request"
    assert "Tokens sampled at temperature 1, a seed per request, the same on both sides." in (
        step_profile.markdown(result))

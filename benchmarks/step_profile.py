"""Where a decode step's GPU time goes inside vLLM: every kernel, megakernel and stock side by side.

    python -m benchmarks.step_profile --model configs/north-mini-code --load-format dummy \\
        --batch 8 --context 8192 --steps 32 --out benchmarks/results/NAME

The decode sweep gives one number per step; the megakernel's step inside vLLM has sat 0.2-0.65 ms above the
kernel alone (benchmarks.kernel_profile) in the runs so far, and this tool says what that is. Each side runs
in its own process (the switch is per process) with vLLM's defaults, as benchmarks.decode_sweep builds it
(prefix-cached prompts, greedy sampling or ``--temperature``'s seeded sampling, ignore_eos). A side's worker
prefills its batch, steps the engine until every request has its first token, then records ``--steps`` pure
decode steps with vLLM's torch profiler (kernels inside CUDA graphs included), and times as many steps again
without the profiler. The orchestrator reads each side's chrome trace and writes ``table.md`` (and
``profile.json``): per side, every GPU kernel, copy and memset with its calls, time per call and time per step,
the GPU's busy time per step (the sum) and the profiled span per step, against the step's wall time unprofiled.
The step count is the engine steps recorded; with async scheduling one step may be in flight at either end, so
per-step figures are good to about 1/steps.

``--phase prefill`` profiles prefills instead: each unit is --batch fresh prompts of --context tokens run to
their first tokens, timed as requests that go on decoding (a server's time to first token, less HTTP) and as
one-token requests (the prefill alone, also what is profiled). Through the server the megakernel side's median
TTFT was about twice stock's at 1K prompts (h200-2026-12-04-v2-session-x call 4) while prefill runs on vLLM's
own forward on both sides; this says whether the engine shows it and in which kernels:

    python -m benchmarks.step_profile --model configs/north-mini-code --load-format dummy \\
        --phase prefill --batch 1 --context 1024 --steps 8 --out benchmarks/results/NAME

``--phase decode,prefill`` runs both phases in one engine per side, in that order (an engine start is most of
a side's time: 50-125 s against seconds of measuring), each with its own trace, ``table-PHASE.md`` and
``profile-PHASE.json``, and ``table.md`` holding both; ``--prefill-batch`` sets the prefill units' prompt
count (default ``--batch``), so one call can profile batch 8's decode step and batch 1's prefill.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from benchmarks import SIDE_CONFIG, write_json_atomic, write_text_atomic
from benchmarks.report import changed_env

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
PHASES = ("decode", "prefill")


def gpu_events(trace: dict) -> list[dict]:
    """The GPU activity of a torch profiler chrome trace: complete events of kernels, copies and memsets."""
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]


def summarize(events: list[dict], steps: int, rows: int = 25) -> dict:
    """Per kernel name: calls, total and per-call microseconds, and microseconds per step; the busy time
    (sum of every event) and the span (first start to last end) per step. Rows sorted by total time; the
    ones past ``rows`` folded into one "other" row."""
    if steps < 1:
        raise ValueError("steps must be >= 1")
    if not events:
        raise ValueError("the trace holds no GPU events: was the profiler on, and did the engine step?")
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in events:
        by_name[e["name"]].append(float(e["dur"]))
    table = [{"name": name, "calls": len(d), "us_per_call": sum(d) / len(d), "us_per_step": sum(d) / steps}
             for name, d in by_name.items()]
    table.sort(key=lambda r: -r["us_per_step"])
    if len(table) > rows:
        rest = table[rows:]
        table = table[:rows] + [{"name": f"other ({len(rest)} kernels)", "calls": sum(r["calls"] for r in rest),
                                 "us_per_call": None, "us_per_step": sum(r["us_per_step"] for r in rest)}]
    start = min(float(e["ts"]) for e in events)
    end = max(float(e["ts"]) + float(e["dur"]) for e in events)
    return {"steps": steps, "busy_us_per_step": sum(float(e["dur"]) for e in events) / steps,
            "span_us_per_step": (end - start) / steps, "kernels": table}


def find_trace(folder: Path) -> Path:
    """The one chrome trace vLLM's profiler wrote into a side's folder (tensorboard_trace_handler naming)."""
    found = sorted(folder.glob("*.pt.trace.json"))
    if len(found) != 1:
        raise FileNotFoundError(f"expected one *.pt.trace.json in {folder}, found {[p.name for p in found]}")
    return found[0]


def markdown(result: dict) -> str:
    prefill = result.get("phase") == "prefill"
    unit = (f"prefills of {result['batch']} fresh prompt(s) of {result['context']} tokens" if prefill
            else f"decode steps at batch {result['batch']}, context {result['context']}")
    # report's reading of a run's sampling (a result written before the key was greedy)
    sampling = changed_env(result).get("sampling")
    sampled = f" Tokens sampled at {sampling}, the same on both sides." if sampling else ""
    lines = [f"{result['steps']} profiled {unit} per side; GPU {result.get('gpu', '?')}, vLLM "
             f"{result.get('vllm', '?')}.{sampled}", ""]
    for side, s in result["sides"].items():
        if "error" in s:
            lines += [f"## {side}", "", f"did not run: {s['error']}", ""]
            continue
        p = s["profile"]
        timing = (f"median prefill of one-token requests without the profiler {s['wall_ms_per_step']:.3f} ms "
                  f"(min {min(s['prefill_ms']):.3f}); median time to the first tokens of requests that go on "
                  f"decoding {statistics.median(s['first_token_ms']):.3f} ms (min {min(s['first_token_ms']):.3f}); "
                  if prefill else f"step wall time without the profiler: {s['wall_ms_per_step']:.3f} ms; ")
        start_up = f" Engine start-up {s['engine_init_s']:.0f} s." if "engine_init_s" in s else ""
        for units, key in (("first-token", "decoder_during_first_token_units"),
                           ("one-token", "decoder_during_prefill_units")):
            if s.get(key):
                d = s[key]
                start_up += (f" During the {units} units the megakernel decoder ran Python for {d['python_launches']} "
                             f"launches, built tables {d['builds']} times ({d['build_ms']:.1f} ms), {d['rebuilds']} of them "
                             f"rebuilds ({d['rebuild_ms']:.1f} ms); its stall "
                             f"check took {d['poison_ms']:.1f} ms of host time over {d['poison_calls']} "
                             "calls.")
        lines += [f"## {side}", "",
                  f"{timing}GPU busy per profiled {'prefill' if prefill else 'step'} "
                  f"{p['busy_us_per_step'] / 1000:.3f} ms, profiled span per step "
                  f"{p['span_us_per_step'] / 1000:.3f} ms. {s['decision']}{start_up}", "",
                  "| kernel | calls | us per call | us per step |", "|---|---|---|---|"]
        for r in p["kernels"]:
            per_call = "-" if r["us_per_call"] is None else f"{r['us_per_call']:.1f}"
            name = r["name"].replace("|", "\\|")
            lines.append(f"| {name[:110]} | {r['calls']} | {per_call} | {r['us_per_step']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def worker(args) -> None:
    """One side: build the engine with vLLM's torch profiler configured, then each phase of ``--phase`` in
    order on it, each writing a small JSON (``phase_path``) and leaving its trace in ``trace_dir/PHASE``."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # for apply_model
    from vllm import LLM

    from benchmarks.decode_sweep import LEN_MARGIN, _decision

    trace_dir = Path(args.trace_dir).resolve()
    trace_dir.mkdir(parents=True, exist_ok=True)
    engine_start = time.perf_counter()
    llm = LLM(model=args.model, load_format=args.load_format, skip_tokenizer_init=True, enable_prefix_caching=True,
              additional_config=SIDE_CONFIG[args.worker],
              max_model_len=args.context + decode_new_tokens(args.steps) + LEN_MARGIN,
              max_num_seqs=max(args.batch, args.prefill_batch), gpu_memory_utilization=args.gpu_memory_utilization,
              seed=0,
              profiler_config={"profiler": "torch", "torch_profiler_dir": str(trace_dir),
                               "torch_profiler_with_stack": False, "torch_profiler_use_gzip": False,
                               "torch_profiler_dump_cuda_time_total": True})
    info = {**llm.apply_model(_decision)[0], "engine_init_s": round(time.perf_counter() - engine_start, 1)}
    run_phases(args, llm, info, trace_dir)


def run_phases(args, llm, info: dict, trace_dir: Path) -> None:
    """Each phase of ``args.phase`` in order on one engine; after each, its trace into ``trace_dir/PHASE``."""
    for phase in args.phase.split(","):
        # each phase writes its own file; the prefill units take --prefill-batch prompts
        phase_args = argparse.Namespace(**{**vars(args), "out": phase_path(args.out, phase),
                                           "batch": args.prefill_batch if phase == "prefill" else args.batch})
        (_prefill_worker if phase == "prefill" else _decode_worker)(phase_args, llm, info)
        # the profiler wrote this phase's trace by the time stop_profile returned: give it its own folder, so
        # that the next phase's trace is the only one in the top folder
        try:
            keep_trace(trace_dir, phase)
        except FileNotFoundError as e:  # the orchestrator reports the phase's missing trace; go on to the next
            print(f"step_profile: no trace for the {phase} phase: {e}", file=sys.stderr)


def phase_path(path, phase: str) -> Path:
    """A side's per-phase file: ``stock.json`` -> ``stock-decode.json``."""
    path = Path(path)
    return path.with_name(f"{path.stem}-{phase}{path.suffix}")


def keep_trace(trace_dir: Path, phase: str) -> Path:
    """Moves the one trace in ``trace_dir`` into ``trace_dir/phase``; returns its new path."""
    found = find_trace(trace_dir)
    (trace_dir / phase).mkdir(exist_ok=True)
    return found.rename(trace_dir / phase / found.name)


def decode_new_tokens(steps: int) -> int:
    """New tokens per decode-phase request: the warm-up steps, the timed ones and the profiled ones, with slack
    for the steps in flight under async scheduling (also what max_model_len leaves room for)."""
    return 3 * steps + 8


def _decode_worker(args, llm, info: dict) -> None:
    """``--phase decode``: record ``steps`` pure decode steps of ``batch`` prefix-cached prompts, time as many
    without the profiler."""
    from vllm.inputs import TokensPrompt

    from benchmarks.decode_sweep import prompt_ids, sampling_params

    engine = llm.llm_engine
    prompts = [TokensPrompt(prompt_token_ids=prompt_ids(args.seed, args.context, i)) for i in range(args.batch)]
    # greedy, or each request sampling with a seed of its own as decode_sweep's --temperature does (the server's
    # default temperature draws fresh tokens every step); decode_new_tokens(steps) tokens a request
    params = sampling_params(args.temperature, decode_new_tokens(args.steps) - 1, args.seed, args.context, args.batch)

    def run(profile: bool) -> float:
        # the prefill (cached prompts: their last block) and first tokens
        _to_first_tokens(engine, [(f"profile-{profile}-{time.monotonic_ns()}-{i}", p, params[i])
                                  for i, p in enumerate(prompts)])
        for _ in range(args.steps):  # decode steps nobody times: graphs, caches and clocks settle
            engine.step()
        if profile:
            llm.start_profile()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        elapsed = time.perf_counter() - t0
        if profile:
            llm.stop_profile()
        while engine.has_unfinished_requests():
            engine.step()
        return elapsed

    run(False)  # warm-up: prefills the prompts into the prefix cache
    wall = run(False)
    run(True)
    write_json_atomic(args.out, {"side": args.worker, "wall_ms_per_step": 1000 * wall / args.steps, **info})


def _to_first_tokens(engine, requests: list[tuple[str, object, object]]) -> None:
    """Adds the (request id, prompt, sampling params) requests and steps the engine until every one has its first
    token."""
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    started: set[str] = set()
    while len(started) < len(requests):
        started.update(o.request_id for o in engine.step() if o.outputs and o.outputs[0].token_ids)


FIRST_TOKEN_NEW_TOKENS = 8  # enough that a decode step is scheduled behind the prefill, as when serving


def decoder_stats(model) -> dict | None:
    """The megakernel decoder's counters (python launches, task-table builds and rebuilds; None on stock)."""
    mk = getattr(model, "megakernel", None)
    return None if mk is None else dict(mk.stats)


def stats_delta(before: dict | None, after: dict | None) -> dict | None:
    """What the decoder did between two reads: a decode step that ran Python or rebuilt its tables inside the
    timed units would show here (the megakernel side's first tokens came ~30 ms later than stock's in session Z,
    one-token requests did not)."""
    if before is None or after is None:
        return None
    return {k: round(after[k] - before[k], 3) for k in after}


def _prefill_worker(args, llm, info: dict) -> None:
    """``--phase prefill``: each unit is one batch of fresh prompts (never in the prefix cache) run to its first
    tokens. Timed two ways, ``--steps`` times each after two warm-ups: to the first tokens of requests that go on
    decoding (under async scheduling a decode step is scheduled behind the prefill before its tokens come out:
    what a server's TTFT sees) and whole requests of one token (the prefill alone). The profiled units are
    one-token requests, so the kernel table holds the prefills and nothing else."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from benchmarks.decode_sweep import prompt_ids

    engine = llm.llm_engine
    runs = itertools.count(1)

    def unit(max_tokens: int) -> float:
        k = next(runs)  # a new seed a unit: prefix caching must not find any of the prompt
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        requests = [(f"prefill-{k}-{i}", TokensPrompt(prompt_token_ids=prompt_ids(args.seed + k, args.context, i)),
                     params) for i in range(args.batch)]
        t0 = time.perf_counter()
        _to_first_tokens(engine, requests)
        elapsed = time.perf_counter() - t0
        while engine.has_unfinished_requests():
            engine.step()
        return 1000 * elapsed

    for _ in range(2):
        unit(FIRST_TOKEN_NEW_TOKENS)
        unit(1)
    before = llm.apply_model(decoder_stats)[0]
    first = [unit(FIRST_TOKEN_NEW_TOKENS) for _ in range(args.steps)]
    middle = llm.apply_model(decoder_stats)[0]
    alone = [unit(1) for _ in range(args.steps)]
    after = llm.apply_model(decoder_stats)[0]
    llm.start_profile()
    for _ in range(args.steps):
        unit(1)
    llm.stop_profile()
    write_json_atomic(args.out, {"side": args.worker, "wall_ms_per_step": statistics.median(alone),
                                 "first_token_ms": first, "prefill_ms": alone,
                                 "decoder_during_first_token_units": stats_delta(before, middle),
                                 "decoder_during_prefill_units": stats_delta(middle, after), **info})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--load-format", default="auto", help="dummy for timing-only weights")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=32, help="decode steps profiled per side (and as many timed)")
    ap.add_argument("--phase", default="decode",
                    help="decode, prefill, or both in one engine (decode,prefill); prefill: each unit is "
                         "--prefill-batch fresh prompts of --context tokens to their first tokens")
    ap.add_argument("--prefill-batch", type=int, help="prompts per prefill unit (default --batch)")
    ap.add_argument("--sides", default="stock,megakernel")
    ap.add_argument("--rows", type=int, default=25, help="kernels listed per side; the rest in one row")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="the decode phase's sampling temperature; 0 (the default) decodes greedily, above 0 each "
                         "request samples with its own seed, the same on both sides (decode_sweep.sampling_params)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/latest-step-profile"))
    ap.add_argument("--worker", choices=list(SIDE_CONFIG), help=argparse.SUPPRESS)
    ap.add_argument("--trace-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.prefill_batch is None:
        args.prefill_batch = args.batch
    phases = args.phase.split(",")
    if not phases or set(phases) - set(PHASES) or len(set(phases)) != len(phases):
        ap.error(f"--phase: a comma-separated list of distinct phases from {PHASES}, got {args.phase!r}")
    if args.temperature < 0:
        ap.error(f"--temperature {args.temperature}: must be 0 (greedy) or more")
    if args.worker:
        return worker(args)
    if args.steps < 1 or args.batch < 1 or args.prefill_batch < 1:
        ap.error("--steps, --batch and --prefill-batch must be >= 1")

    import torch
    import vllm

    from benchmarks.decode_sweep import sampling_name

    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join([sys.executable, "-m", "benchmarks.step_profile"] + (argv or sys.argv[1:]))
    results = {phase: {"batch": args.prefill_batch if phase == "prefill" else args.batch, "context": args.context,
                       "steps": args.steps, "phase": phase, "gpu": torch.cuda.get_device_name(),
                       "vllm": vllm.__version__, "sides": {}, "command": command,
                       # the prefill units take their first tokens greedily whatever --temperature says
                       "sampling": sampling_name(args.temperature if phase == "decode" else 0.0)}
               for phase in phases}
    for side in args.sides.split(","):
        trace_dir, part = args.out / f"{side}-trace", args.out / f"{side}.json"
        for phase in phases:  # never read an earlier run's files
            phase_path(part, phase).unlink(missing_ok=True)
        for old in trace_dir.glob("**/*.pt.trace.json"):
            old.unlink()
        rc = subprocess.run(worker_command(args, side, trace_dir, part)).returncode
        for phase in phases:  # a phase that finished before the worker failed keeps its figures
            results[phase]["sides"][side] = read_side(phase_path(part, phase), trace_dir / phase, args.steps,
                                                      args.rows, rc, side)
    texts = []
    for phase, result in results.items():
        suffix = "" if len(phases) == 1 else f"-{phase}"
        write_json_atomic(args.out / f"profile{suffix}.json", result, indent=1)
        texts.append(markdown(result))
        if suffix:
            write_text_atomic(args.out / f"table{suffix}.md", texts[-1])
    text = "\n".join(texts if len(phases) == 1 else [f"# {p}\n\n{t}" for p, t in zip(phases, texts)])
    write_text_atomic(args.out / "table.md", text)
    print(text)


def worker_command(args, side: str, trace_dir: Path, part: Path) -> list[str]:
    """The command line of one side's worker process: the run's settings, that side's switch."""
    return [sys.executable, "-m", "benchmarks.step_profile", "--worker", side, "--model", args.model,
            "--load-format", args.load_format, "--batch", str(args.batch), "--context", str(args.context),
            "--steps", str(args.steps), "--gpu-memory-utilization", str(args.gpu_memory_utilization),
            "--seed", str(args.seed), "--temperature", str(args.temperature), "--phase", args.phase,
            "--prefill-batch", str(args.prefill_batch), "--trace-dir", str(trace_dir), "--out", str(part)]


def read_side(part: Path, trace_dir: Path, steps: int, rows: int, rc: int, side: str) -> dict:
    """One side's result for one phase: its worker's JSON with the summary of its trace, or the error."""
    try:
        if not part.exists():
            raise RuntimeError(f"the {side} worker exited {rc} before this phase's figures; see its output above")
        side_result = json.loads(part.read_text())
        trace = json.loads(find_trace(trace_dir).read_text())
        side_result["profile"] = summarize(gpu_events(trace), steps, rows)
        return side_result
    except (RuntimeError, FileNotFoundError, ValueError) as e:
        return {"error": str(e)}


if __name__ == "__main__":
    main()

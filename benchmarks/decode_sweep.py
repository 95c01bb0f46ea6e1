"""Decode sweep: megakernel and stock vLLM side by side, in one run, on the same machine and weights.

    python -m benchmarks.decode_sweep --model configs/north-mini-code --load-format dummy \\
        --batch-sizes 1,2,4,8,16,32,64 --contexts 1024,8192,32768,131072 --out benchmarks/results/NAME

Each side runs in its own process (plugins and the switch are per process) with vLLM's defaults otherwise
(torch.compile and its CUDA graphs on, FA3, Triton MoE, async scheduling); prefix caching is off so every
request is prefilled, unless --cache-prompts: then the warm-up leaves each case's prompts in vLLM's prefix
cache (the workers run with VLLM_PREFIX_CACHE_RETENTION_INTERVAL=0, without which 8 prompts of 128K missed it:
worker_command) and the timed runs recompute only their last block, which takes the prefill (B x context tokens,
minutes at 32K-128K contexts) out of every timed run without changing the decode work both terms
contain; a batch's prompts are the smaller batches' plus new ones, so a warm-up prefills only the new ones
while they stay cached. Per case, with random prompt ids, ignore_eos and greedy sampling (or seeded sampling at
--temperature), one run of N + 1 new tokens per repeat, its engine steps timed one by one (decode_interval):
    per-request decode tok/s = S / (time from the step that gave every request its first token to the step
                                    in which the first request finished),
S the steps in between, each a decode step of the whole batch (N when the prefills all end on one step), so the
prefill, cached or not, is outside the interval and so is a tail of smaller batches (until session AR the interval
ran to the last request's end, which staggered prefills at 8 x 128K turned into a shrinking batch's tail); repeated
(median and spread reported) after one
warm-up. (Until 2026-12-01 the rate was N / (t(N + 1 tokens) - t(1 token)) over two separate runs, which a
1-token run with a slow prefill inflated past the speed of light: see
benchmarks/results/h200-2026-12-01-v2-claims-vs-stock-8k.) The stock side also measures how many distinct
experts a step at each batch size runs (benchmarks.routing_probe, on the engine's own weights, over a short
synthetic history), and the megakernel side reads how many its last step of each case routed (the route
buffer's per-layer counts, which a replayed CUDA graph leaves behind); the speed of light uses the run's count
where there is one (benchmarks.report). The orchestrator also measures HBM bandwidth
and writes results.json, table.md and PNG plots (benchmarks.report). A progress line is printed per case.
Cases whose sequences do not all fit the KV cache at once (counted per KV-cache group, as vLLM allocates:
benchmarks.kv_fit) are skipped and say so. If the megakernel side
could not run the megakernel, the table says so plainly instead of showing a speedup.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import SIDE_CONFIG, write_json_atomic
from benchmarks.report import ENV_DEFAULTS
from vllm_megakernel.options import UNIFORM_ROUTING


def _decision(model) -> dict:
    d = getattr(model, "megakernel_decision", None)
    return {"use_megakernel": bool(d and d.use_megakernel), "decision": d.log_line() if d else "plugin not loaded"}


def graph_batch(batch: int, capture_sizes) -> int:
    """The size a decode batch runs at: vLLM pads it to the smallest CUDA-graph size that holds it (none: as is)."""
    return min((s for s in capture_sizes or () if s >= batch), default=batch)


def _run_routed_experts(model, batch: int) -> float | None:
    """For ``LLM.apply_model`` after a case's runs: the distinct experts per MoE layer the megakernel's last step
    of that size routed (MegakernelDecoder.last_routed_experts), or None without the megakernel."""
    mk = getattr(model, "megakernel", None)
    return mk.last_routed_experts(batch) if mk is not None else None


RETENTION_VAR = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"  # vLLM's: which sliding-window blocks keep a prefix hash
LEN_MARGIN = 16  # max_model_len headroom over the longest context plus its new tokens


def check_contexts(contexts: list[int], new_tokens: int, config: dict, max_model_len: int | None = None) -> None:
    """A context whose sequence would outgrow the model's positions (or a --max-model-len given) is an error up
    front, not an engine failure minutes later; the message names the longest context that fits (the 256K grid
    point)."""
    positions = config["max_position_embeddings"]
    if max_model_len is not None and not 0 < max_model_len <= positions:
        raise ValueError(f"--max-model-len {max_model_len} is outside the model's 1..{positions} positions")
    limit = max_model_len or positions
    what = f"--max-model-len {limit}" if max_model_len else f"the model's {limit} positions"
    longest = limit - new_tokens - LEN_MARGIN
    too_long = [c for c in contexts if c > longest]
    if too_long:
        raise ValueError(f"contexts {too_long} plus {new_tokens} new tokens exceed {what}; "
                         f"the longest context that fits is {longest}")


_REQUEST_IDS = itertools.count()  # request ids unique over the engine's life


@dataclasses.dataclass(frozen=True)
class Interval:
    """One run's timing (decode_interval)."""
    to_first_s: float  # until every request had its first token
    seconds: float  # the whole-batch decode steps after that: every request live, none finished before
    steps: int  # how many such steps
    whole: bool  # every request finished on the run's last step: the steps are all of the run's decode

    @property
    def per_request_tok_s(self) -> float:
        return self.steps / self.seconds


class NoWholeBatch(RuntimeError):
    """A run in which no step decoded every request (decode_interval): the case has no batch-B rate."""


def decode_interval(engine, prompts, params, clock=None) -> Interval:
    """Runs ``prompts`` (with ``params``, one SamplingParams each) to completion on a vLLM ``LLMEngine``, stepping
    it here, and times the steps in which the whole batch decodes: from the step that gave every request its first
    token to the first step in which a request finished. When the requests' prefills all end on one step (cached
    prompts) that is every decode step, N for ``max_tokens`` N + 1; when they end step by step (chunked prefill, one
    long prompt after another), the early requests decode alongside the later prefills and finish first, and the
    steps after that run a smaller batch: those are left out (session AR's 8 x 128K runs, where they had inflated
    the rate past the speed of light). ``whole`` (every request finished on the window's last step) is best effort:
    the engine core may admit the first prompts a step before the rest, which leaves the rate right and the last
    steps one or two requests short."""
    if len(params) != len(prompts):
        raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts: one each")
    clock = clock or time.perf_counter
    start = clock()
    for p, sp in zip(prompts, params):
        engine.add_request(f"sweep-{next(_REQUEST_IDS)}", p, sp)
    tokens: dict[str, int] = {}  # each request's output tokens so far (vLLM's outputs are cumulative)
    first = end_full = None
    at_first: dict[str, int] = {}
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = clock()
        tokens.update((o.request_id, len(o.outputs[0].token_ids))
                      for o in outputs if o.outputs and o.outputs[0].token_ids)
        done = [o.request_id for o in outputs if o.finished]
        if first is None:
            if done:  # the batch never decodes whole: a later prompt was still waiting for its first token
                raise NoWholeBatch(f"a request finished its {tokens[done[0]]} tokens before "
                                   f"{len(prompts) - len(tokens)} of the {len(prompts)} prompts had their first "
                                   "token: no step decoded the whole batch (more --new-tokens, or cached prompts)")
            if len(tokens) == len(prompts):
                first, at_first = now, dict(tokens)
            continue
        if end_full is None and done:
            # every request decoded once a step until here, so the first to finish counts the steps
            end_full, steps, whole = now, tokens[done[0]] - at_first[done[0]], len(done) == len(prompts)
    if end_full is None:  # vLLM marks the output that carries a request's last token finished
        raise RuntimeError(f"{len(tokens)} of {len(prompts)} requests produced a token and none reported finishing")
    return Interval(to_first_s=first - start, seconds=end_full - first, steps=steps, whole=whole)


def prompt_ids(seed: int, context: int, index: int) -> list[int]:
    """The index-th random prompt of a context length: a function of (seed, context, index) alone, so both
    sides get the same prompts and a batch's prompts are the smaller batches' plus new ones. With
    --cache-prompts the warm-up of batch 2B then prefills only B new prompts; the timed runs are unchanged."""
    rng = random.Random(f"{seed}/{context}/{index}")
    return [rng.randrange(10, 100_000) for _ in range(context)]


def sampling_params(temperature: float, new_tokens: int, seed: int, context: int, count: int) -> list:
    """The first ``count`` requests' SamplingParams at a context length: N + 1 tokens, ignore_eos. Greedy at
    temperature 0, the default. Above 0 each request samples with a seed of its own, a function of (seed, context,
    index) as its prompt is, so both sides' workers draw the same noise and, where their logits agree closely,
    the same tokens. Why sample: a server at its default temperature 1.0 draws fresh tokens, and so fresh routing,
    every step, where greedy decoding on dummy weights may hold a run's tokens to a few sets (a CPU reading, not
    measured); batch 8's greedy step at 1K moved by a few percent between runs and prompt seeds (PERF_LOG #211)."""
    from vllm import SamplingParams

    if temperature == 0:
        return [SamplingParams(temperature=0.0, max_tokens=new_tokens + 1, ignore_eos=True)] * count
    return [SamplingParams(temperature=temperature, max_tokens=new_tokens + 1, ignore_eos=True,
                           seed=random.Random(f"sample/{seed}/{context}/{i}").getrandbits(31)) for i in range(count)]


def worker(args) -> None:
    """One side: build the engine once, run every case, write a JSON list of cases."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # for apply_model
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    from benchmarks.kv_fit import case_blocks_needed, describe, kv_groups, usable_blocks

    cases = json.loads(args.cases)
    max_ctx = max(c["context"] for c in cases)
    max_batch = max(c["batch"] for c in cases)
    engine_start = time.perf_counter()
    llm = LLM(model=args.model, load_format=args.load_format, skip_tokenizer_init=True,
              enable_prefix_caching=args.cache_prompts, additional_config=SIDE_CONFIG[args.side],
              max_model_len=args.max_model_len or max_ctx + args.new_tokens + LEN_MARGIN,
              max_num_seqs=max(max_batch, 1), gpu_memory_utilization=args.gpu_memory_utilization, seed=0)
    vllm_config = llm.llm_engine.vllm_config
    cache = vllm_config.cache_config
    kv_blocks = cache.num_gpu_blocks or 0
    batched = vllm_config.scheduler_config.max_num_batched_tokens
    groups = kv_groups(json.loads((Path(args.model) / "config.json").read_text()), cache.block_size, vllm_config)
    info = llm.apply_model(_decision)[0]
    # the engine's start-up (weights, torch.compile, graph capture; the megakernel's task lists): a user's wait
    info["engine_init_s"] = round(time.perf_counter() - engine_start, 1)
    print(f"[{args.side}] engine ready in {info['engine_init_s']} s", flush=True)
    distinct: dict[int, float] = {}
    if args.probe_routing and args.side == "stock":  # same weights on both sides: measure once
        from benchmarks.routing_probe import probe_vllm_model

        for b in sorted({c["batch"] for c in cases}):
            distinct[b] = llm.apply_model(lambda m, b=b: probe_vllm_model(m, b))[0]
            print(f"[{args.side}] batch {b}: {distinct[b]:.1f} distinct experts per MoE layer (measured)", flush=True)
    results = []
    for case in cases:
        b, ctx = case["batch"], case["context"]
        need = case_blocks_needed(groups, b, ctx, args.new_tokens, batched)
        out = {"side": args.side, "batch": b, "context": ctx, "kv_blocks": kv_blocks, "kv_blocks_needed": need,
               "kv_groups": describe(groups), "max_num_batched_tokens": batched,
               "distinct_experts": distinct.get(b), **info}
        runs: list[Interval] = []
        if need > usable_blocks(kv_blocks):  # vLLM would run only part of the batch at a time: no batch-b rate
            out.update(status="skipped",
                       reason=f"does not fit the KV cache: {b} sequences of {ctx} + {args.new_tokens} tokens need "
                              f"{need} blocks in {describe(groups)}; the engine has {kv_blocks}")
        else:
            prompts = [TokensPrompt(prompt_token_ids=prompt_ids(args.seed, ctx, i)) for i in range(b)]
            params = sampling_params(args.temperature, args.new_tokens, args.seed, ctx, b)
            try:
                decode_interval(llm.llm_engine, prompts, params)  # warm-up at this shape
                runs = [decode_interval(llm.llm_engine, prompts, params) for _ in range(args.repeats)]
            except NoWholeBatch as e:
                out.update(status="failed", reason=str(e))
        if runs:
            # per repeat: seconds to every request's first token, seconds of the whole-batch decode steps, their
            # count, and whether they were all of the run's decode (the requests' first tokens on one step)
            out.update(status="ok", per_request_tok_s=[r.per_request_tok_s for r in runs],
                       timings_s=[[r.to_first_s, r.seconds, r.steps, r.whole] for r in runs])
            if args.side == "megakernel":
                # the run's own routing, read from the last step's route words: a step of the whole batch only
                # if every request finished on it
                size = graph_batch(b, vllm_config.compilation_config.cudagraph_capture_sizes)
                out["run_distinct_experts"] = (llm.apply_model(lambda m, s=size: _run_routed_experts(m, s))[0]
                                               if runs[-1].whole else None)
        results.append(out)
        write_json_atomic(args.out, results)  # after every case: a run cut short keeps what it measured
        med = statistics.median(out["per_request_tok_s"]) * b if out["status"] == "ok" else None
        print(f"[{args.side}] batch {b} context {ctx}: "
              + (f"{med:.0f} tok/s aggregate" if med else out["reason"]), flush=True)


class Stopped(Exception):
    pass


def _raise_stopped(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def worker_command(args, side: str, cases: list[dict], part: Path) -> tuple[list[str], dict]:
    """The command line and environment of one side's worker process. Uniform routing is vLLM's routing
    simulator (VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random), which the megakernel follows too (its
    step table's uniform_routing), so it applies to both sides; the weights' own routing is then not what
    runs, so the routing probe is skipped and the speed of light uses the uniform formula."""
    env = dict(os.environ)
    # --uniform-routing is the one way to simulate routing, so the recorded env always says what ran
    env.pop("VLLM_MOE_ROUTING_SIMULATION_STRATEGY", None)
    env.pop(RETENTION_VAR, None)
    if args.cache_prompts:
        # By default vLLM keeps a hash on every sliding-window block, and a freed block with a hash goes to the free
        # queue's tail, where the next allocations evict it last but in order: at 8 x 128K the later prompts'
        # prefills evict the first window blocks an earlier prompt freed at its first decode step, a replay's
        # sliding groups then find fewer than the window's 256 blocks in a row, the hybrid hit drops to 0 in every
        # group, and every timed run prefilled again (session AR, 42 s a run; a CPU replay of vLLM's scheduler and
        # KV-cache manager showed it at batch 8 and 16, not 4). Retention 0 hashes only each prompt's replay
        # boundary, so the blocks freed behind the window carry no hash and are reused first.
        env[RETENTION_VAR] = "0"
    probe = args.probe_routing
    if args.uniform_routing:
        env["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] = UNIFORM_ROUTING
        probe = False
    cmd = [sys.executable, "-m", "benchmarks.decode_sweep", "--worker", side, "--cases", json.dumps(cases),
           "--model", args.model, "--load-format", args.load_format, "--new-tokens", str(args.new_tokens),
           "--repeats", str(args.repeats), "--gpu-memory-utilization", str(args.gpu_memory_utilization),
           "--seed", str(args.seed), "--temperature", str(args.temperature), "--out", str(part)] \
        + ([] if probe else ["--no-probe-routing"]) + (["--cache-prompts"] if args.cache_prompts else []) \
        + (["--max-model-len", str(args.max_model_len)] if args.max_model_len else [])
    return cmd, env


def collect_side(side: str, cases: list[dict], part: Path, returncode: int | str) -> tuple[list[dict], dict]:
    """One side's case results and its decision. The worker rewrites its JSON after every case, so a worker
    that died or was stopped part-way still gives the cases it finished; the rest are marked failed."""
    got = json.loads(part.read_text()) if part.exists() else []
    done = {(c["batch"], c["context"]) for c in got}
    how = returncode if isinstance(returncode, str) else f"exit {returncode}"
    reason = f"the {side} engine stopped ({how}) before this case; see its output above"
    got += [{"side": side, **c, "status": "failed", "reason": reason} for c in cases
            if (c["batch"], c["context"]) not in done]
    if done:
        first = next(c for c in got if "decision" in c)
        return got, {"use_megakernel": first["use_megakernel"], "decision": first["decision"]}
    return got, {"use_megakernel": False, "decision": reason}


def sampling_name(temperature: float) -> str:
    """How the run's tokens were chosen, as results.json's env records it (a run without the key was greedy)."""
    return ENV_DEFAULTS["sampling"] if temperature == 0 else f"temperature {temperature:g}, a seed per request"


def environment(args) -> dict:
    import torch
    import vllm

    return {"gpu": torch.cuda.get_device_name(), "vllm": vllm.__version__, "torch": torch.__version__,
            "repeats": args.repeats, "load_format": args.load_format, "model": str(args.model),
            "graph_mode": "vLLM default (FULL_AND_PIECEWISE, torch.compile)", "attention": "vLLM default (FA3)",
            "moe": "vLLM default (Triton on Hopper)",
            "routing_simulation": f"{UNIFORM_ROUTING} (both sides)" if args.uniform_routing else "off",
            "prefix_caching": args.cache_prompts, "sampling": sampling_name(args.temperature),
            "max_model_len": args.max_model_len or ENV_DEFAULTS["max_model_len"],
            **({"prefix_cache_retention": "0 (vLLM keeps each prompt's replay boundary)"}
               if args.cache_prompts else {})}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--load-format", default="auto", help="dummy for timing-only weights")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--contexts", default="1024,8192,32768,131072")
    ap.add_argument("--sides", default="stock,megakernel")
    ap.add_argument("--new-tokens", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/latest"))
    ap.add_argument("--uniform-routing", action="store_true",
                    help="both sides route uniformly at random (VLLM_MOE_ROUTING_SIMULATION_STRATEGY="
                         "uniform_random, which the megakernel follows too), the write-up's random-weights setting")
    ap.add_argument("--no-probe-routing", dest="probe_routing", action="store_false",
                    help="skip measuring distinct experts per step (SOL then assumes uniform routing)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sampling temperature of every request; 0 (the default) decodes greedily, above 0 each "
                         "request samples with its own seed, the same on both sides (sampling_params)")
    ap.add_argument("--cache-prompts", action="store_true",
                    help="keep prompts in vLLM's prefix cache after the warm-up (timed runs skip the prefill)")
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="both engines' max_model_len (default: fitted, the longest context + new tokens + "
                         f"{LEN_MARGIN}); a server leaves it at the model's positions, and vLLM copies every "
                         "step's block-table rows at that width")
    ap.add_argument("--worker", choices=list(SIDE_CONFIG), help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.temperature < 0:
        ap.error(f"--temperature {args.temperature}: must be 0 (greedy) or more")
    if args.worker:
        args.side = args.worker
        return worker(args)

    from benchmarks import report
    from benchmarks.sol import measure_bandwidth

    cases = [{"batch": int(b), "context": int(c)} for c in args.contexts.split(",")
             for b in args.batch_sizes.split(",")]
    config = json.loads((Path(args.model) / "config.json").read_text())
    try:
        check_contexts(sorted({c["context"] for c in cases}), args.new_tokens, config, args.max_model_len)
    except ValueError as e:
        ap.error(str(e))
    args.out.mkdir(parents=True, exist_ok=True)
    bandwidth = measure_bandwidth()
    print(f"measured HBM bandwidth: {bandwidth / 1e12:.2f} TB/s (copy, read + write)", flush=True)
    env_record = environment(args)  # now: imports take seconds a stopped run may not have
    # A run stopped from outside (a time limit's SIGTERM, Ctrl-C) stops its worker and still writes the
    # results and table of every case finished so far.
    signal.signal(signal.SIGTERM, _raise_stopped)
    all_cases, sides, stopped = [], {}, None
    for side in args.sides.split(","):
        part = args.out / f"{side}.json"
        cmd, env = worker_command(args, side, cases, part)
        part.unlink(missing_ok=True)  # never mistake an earlier run's cases for this one's
        if stopped:
            rc = stopped
        else:
            proc = subprocess.Popen(cmd, env=env)
            try:
                rc = proc.wait()
            except (Stopped, KeyboardInterrupt) as e:
                stopped = rc = f"stopped by {e}" if isinstance(e, Stopped) else "stopped by an interrupt"
                print(f"decode_sweep: {stopped}; keeping the cases finished so far", flush=True)
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
        got, sides[side] = collect_side(side, cases, part, rc)
        all_cases += got
    result = {"env": env_record, "bandwidth_bytes_per_s": bandwidth, "new_tokens": args.new_tokens,
              "config": config, "sides": sides, "cases": all_cases,
              "command": " ".join([sys.executable, "-m", "benchmarks.decode_sweep"] + (argv or sys.argv[1:]))}
    print(report.write(result, args.out))


if __name__ == "__main__":
    main()

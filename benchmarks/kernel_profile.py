"""Where the megakernel's decode step spends its time: the kernel alone (no vLLM, no LM head), the whole
model on random weights, a per-wave breakdown from a traced launch.

    python -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,8,64 --context 8192 \
        [--schedules "default;norm=wave;attn_splits=64,moe_up_cols=32"] [--out DIR]

Per batch size: the median step time of --iters untraced launches (CUDA events), the bytes the step read
(weights of the experts the kernel actually chose, from its routing log, plus the KV it attended over) and
the bandwidth that is, against the copy bandwidth measured in the same run; then megakernel.trace's table
of one traced launch, with the bytes each wave must move per layer (every weight and K/V byte once) and
the bandwidth that gives over the wave's span. This is the tool for deciding what v2 changes; end-to-end
speed against stock vLLM comes from benchmarks.decode_sweep. --schedules compares schedules in one run:
each is a comma-separated list of StepShape choices (its fields but batch, num_sms and tiles: attn_splits,
attn_min_tiles, combine_heads, norm, order: a schedule.WAVE_ORDERS name, expert_claims: 0 or 1, o_within_down:
a fraction, deal: a schedule.DEALS name, moe_combine_cols, combine_in_norm: 0 or 1, qkv_batch_split, o_batch_split) and GEMM
task sizes (layout.GemmTiles fields), or "default". With --out the report is also written there after every
row (report.md and profile.json; with --save-traces also traces.pt: every task's trace record of each
row's traced launch, on the first placement; `--model M --reread DIR` computes the tables that read them
again, on the CPU, into DIR/reread.md). Each row also records the SM clock and nvidia-smi's clock-event
reasons just before and after its timed launches (batch 1 is latency-bound: a lowered clock shows there first).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from pathlib import Path

ATTENTION_WAVES = ("attn_partial", "attn_combine")


# How --schedules reads a StepShape choice's value (the rest: ints); the choices are StepShape's own fields
SHAPE_VALUE = {"norm": str, "order": str, "deal": str, "split_order": str, "combine_place": str,
               "expert_claims": lambda v: bool(int(v)), "combine_in_norm": lambda v: bool(int(v)),
               "local_routing": lambda v: bool(int(v)), "posted_routing": lambda v: bool(int(v)),
               "posted_scores": lambda v: bool(int(v)),
               "o_prefetch": lambda v: bool(int(v)), "o_within_down": float}


def parse_schedule(text: str) -> dict:
    """'default' or 'key=value,...' -> StepShape keyword arguments (GEMM tile sizes under ``tiles``)."""
    from vllm_megakernel.megakernel.layout import GemmTiles
    from vllm_megakernel.megakernel.schedule import StepShape

    shape_keys = [f.name for f in dataclasses.fields(StepShape) if f.name not in ("batch", "num_sms", "tiles")]
    shape: dict = {}
    tiles = []
    if text.strip() in ("", "default"):
        return shape
    tile_names = {f.name for f in dataclasses.fields(GemmTiles)}
    for item in text.split(","):
        key, _, value = item.partition("=")
        key = key.strip()
        if key in shape_keys:
            shape[key] = SHAPE_VALUE.get(key, int)(value.strip())
        elif key in tile_names:
            tiles.append((key, int(value)))
        else:
            raise ValueError(f"unknown schedule choice {key!r} (know {shape_keys} and {sorted(tile_names)})")
    if tiles:
        shape["tiles"] = tuple(tiles)
    return shape


def parse_smi_clocks(text: str) -> dict | None:
    """nvidia-smi's csv line 'SM MHz, reasons bitmask' (noheader, nounits) -> {"sm_mhz", "reasons"}."""
    parts = [p.strip() for p in text.strip().splitlines()[0].split(",")] if text.strip() else []
    if len(parts) != 2 or not parts[0].isdigit():
        return None
    return {"sm_mhz": int(parts[0]), "reasons": parts[1]}


def gpu_clocks() -> dict | None:
    """The timed GPU's SM clock and active clock-event (throttle) reasons now, from nvidia-smi (None when it
    cannot say). A batch-1 step is latency-bound, so a lowered SM clock slows it where the copy bandwidth
    test barely moves: A/B runs have disagreed by 14-18% at batch 1 alone."""
    import os
    import subprocess

    index = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        try:
            done = subprocess.run(["nvidia-smi", "-i", index, f"--query-gpu=clocks.sm,{reasons}",
                                   "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode == 0 and (got := parse_smi_clocks(done.stdout)):
            return got
    return None


def random_weights(config: dict, dims, seed: int = 0):
    """The config's model (``dims``: its shape, or a cut of it) on realistic random full-size weights, made on
    the GPU: what every kernel-alone tool here times."""
    from vllm_megakernel import reference as ref

    return ref.Weights.random(dims, config["intermediate_size"], config.get("prefix_dense_intermediate_size") or 0,
                              "cuda", seed=seed)


KV_BLOCK_SIZE = 16
KV_FIT_MARGIN = 2 << 30  # beside the K/V stand-in: the step's workspace, its tables and the traced launch's records


def kv_does_not_fit(dims, batch: int, context: int, free_bytes: int) -> str | None:
    """Why random_step_inputs' K/V stand-in for ``batch`` rows of ``context`` history would not fit the GPU's
    free memory beside the weights (with KV_FIT_MARGIN to spare), or None when it fits: on an 80 GB H100, 64 rows
    of 8K (49 GiB of bf16 K/V, every layer holding the whole pool) do not, and the run used to end there in an
    out-of-memory error (session AN, call 1)."""
    import torch

    from vllm_megakernel.paged_kv import PagedKVSim

    need = PagedKVSim.cache_bytes(dims, batch, context + 1, KV_BLOCK_SIZE, torch.bfloat16)
    if need + KV_FIT_MARGIN <= free_bytes:
        return None
    return (f"batch {batch}, context {context}: not run, its K/V stand-in needs {need / 2**30:.1f} GiB and "
            f"{free_bytes / 2**30:.1f} GiB were free beside the weights ({KV_FIT_MARGIN >> 30} GiB kept spare)")


def random_step_inputs(dims, batch: int, context: int, seed: int):
    """A decode step's inputs on the GPU: ``batch`` requests of ``context`` cached tokens each (random K/V),
    one random new token each."""
    import torch

    from vllm_megakernel.paged_kv import PagedKVSim

    sim = PagedKVSim(dims, num_requests=batch, max_len=context + 1, block_size=KV_BLOCK_SIZE, dtype=torch.bfloat16,
                     device="cuda", seed=seed)
    sim.fill_history([context] * batch, values=False)
    for cache in sim.kv_caches:  # whole caches at once; the values only need to be finite
        cache.normal_()
    gen = torch.Generator().manual_seed(seed)
    return sim.step([int(torch.randint(0, dims.vocab, (1,), generator=gen)) for _ in range(batch)])


def profile_batch(dims, weights, batch: int, context: int, iters: int, num_sms: int, seed: int,
                  schedule: str = "default") -> dict:
    from benchmarks.sol import cuda_times
    from vllm_megakernel.megakernel import runtime
    from vllm_megakernel.megakernel.schedule import StepShape, build_schedule

    inp = random_step_inputs(dims, batch, context, seed)
    shape = StepShape(batch=batch, num_sms=num_sms, **parse_schedule(schedule))
    sched = build_schedule(dims, shape, *weights.intermediates())

    plain = runtime.build_step(sched, weights, inp)
    clocks = [gpu_clocks()]
    times = [t * 1e6 for t in cuda_times(lambda: runtime.launch(plain), iters, warmup=3)]  # us
    clocks.append(gpu_clocks())
    runtime.check(plain)

    out = {"batch": batch, "context": context, "schedule": schedule, "attn_splits": shape.attn_splits,
           "tiles": dataclasses.asdict(sched.tiles), "tasks": len(sched.tasks),
           "step_us_median": statistics.median(times), "step_us_min": min(times),
           "clocks": clocks}  # before and after the timed launches (None where nvidia-smi could not say)
    out.update(traced_launch(dims, weights, inp, sched))
    return out


def traced_launch(dims, weights, inp, sched, ext=None) -> dict:
    """One traced launch of ``sched`` (with the routing log) on ``ext`` (default the package's extension): the
    report's per-wave table, layer timeline, SMs' layer ends, split by previous opcode, what the SMs do over a
    layer, the distinct experts the kernel chose, and every task's record (``task_trace``)."""
    from vllm_megakernel.megakernel import runtime, trace
    from vllm_megakernel.megakernel.schedule import ROUTING_WAVES

    traced = runtime.build_step(sched, weights, inp, route_log=True, trace=True)
    runtime.launch(traced, ext=ext)
    runtime.check(traced)
    step_us, rows = trace.summarize(sched, traced.trace)
    middle = trace.middle_moe_layers(dims)
    next_layer_us, timeline = trace.layer_timeline(sched, traced.trace, middle)
    spread, sm_ends = trace.layer_ends(sched, traced.trace, middle)
    rec = traced.trace.cpu()
    ran = trace.ran_tasks(sched, rec)  # a dead slot's skipped expert task has no record
    ops, waves = [int(t.op) for t in sched.tasks], [t.wave for t in sched.tasks]
    previous = trace.after_previous(ops, waves, rec, ran)
    chosen = runtime.routing_log(traced.workspace, dims, len(inp.input_ids))
    moe = [i for i in range(dims.num_layers) if not dims.dense[i]]
    distinct_in = {i: len(set(chosen[i].flatten().tolist())) for i in moe}
    distinct = statistics.mean(distinct_in.values())
    i_moe, i_dense = weights.intermediates()
    activity = layer_activity_of(dims, i_moe, i_dense, sched, rec, inp.seq_lens.tolist(), distinct_in)
    hops = trace.layer_hops(sched, rec, middle)
    tails = trace.signal_tails(sched, rec, middle)
    checks = trace.input_checks(sched, rec, middle)
    phases = trace.layer_phases(sched, rec, middle)
    critical = trace.critical_path(sched, rec, middle)
    task_trace = task_trace_of(sched, rec)
    # where the hardware put the blocks, and the routing's blocks on the timeline's first layer: batch 1's
    # speed differs between processes with the routing chain (PERF_LOG #93)
    routing = {w: trace.wave_physical_sms(sched, rec, middle[0], w) for w in ROUTING_WAVES}
    return {"traced_step_us": step_us, "distinct_experts": distinct,
            "physical_sms": trace.physical_sms(sched, rec), "routing_physical_sms": {"layer": middle[0], **routing},
            "waves": [dataclasses.asdict(r) for r in rows],
            "timeline": {"layers": f"MoE layers {middle[0]}-{middle[-1]}", "next_layer_us": next_layer_us,
                         "waves": [dataclasses.asdict(r) for r in timeline]},
            "ends": {"spread": spread, "waves": [dataclasses.asdict(r) for r in sm_ends]},
            "after_previous": [dataclasses.asdict(r) for r in previous],
            "activity": {"layers": f"MoE layers {middle[0]}-{middle[-1]}",
                         "bins": [dataclasses.asdict(r) for r in activity]},
            "hops": [dataclasses.asdict(r) for r in hops],
            "tails": [dataclasses.asdict(r) for r in tails],
            "checks": [dataclasses.asdict(r) for r in checks],
            "phases": dataclasses.asdict(phases),
            "critical": dataclasses.asdict(critical),
            "task_trace": task_trace}


def layer_activity_of(dims, i_moe: int, i_dense: int, sched, rec, seq_lens: list[int], distinct_in: dict):
    """What the SMs do over the middle MoE layers (trace.layer_activity), each task with its share of the bytes
    its wave moves in its layer (``distinct_in``: the layer's distinct experts, from the routing log)."""
    from vllm_megakernel.megakernel import trace

    nbytes = trace.task_bytes(sched, rec, lambda wave, layer: layer_wave_bytes(
        dims, i_moe, i_dense, layer, seq_lens, distinct_in.get(layer, 0), wave))
    return trace.layer_activity(sched, rec, trace.middle_moe_layers(dims), nbytes)


def task_trace_of(sched, rec) -> dict:
    """Every task's record in the form traces.pt keeps (--save-traces): the six times after the step's first
    wait (int32 ns; -1 where a task left a field unmarked or never ran), the block, the physical SM, and each
    task's opcode, layer and wave. records_of() turns it back into records."""
    import torch

    from vllm_megakernel.megakernel import abi, trace

    _, col = trace.record_fields(rec)
    ran = trace.ran_tasks(sched, rec)
    time_fields = tuple(f for f in abi.TRACE_FIELDS if f.endswith("_ns"))  # not the block, not the physical SM
    times = torch.stack([col[name] for name in time_fields], dim=1)
    t0 = int(col["wait_start_ns"][ran].min())
    trace_times = torch.where(times > 0, times - t0, -1)
    return {"sm": col["sm"].to(torch.int16), "smid": col["smid"].to(torch.int16),
            "times_ns": trace_times.to(torch.int32), "time_fields": time_fields,
            "op": torch.tensor([int(t.op) for t in sched.tasks], dtype=torch.int16),
            "layer": torch.tensor([t.layer for t in sched.tasks], dtype=torch.int16),
            "waves": [t.wave for t in sched.tasks]}


# records_of() puts a saved trace's times after this stamp: 0 still means "not marked", as in a live trace
REREAD_T0_NS = 1 << 20


def records_of(task_trace: dict):
    """The int64 records (abi.TRACE_FIELDS columns) of a task_trace_of() dict: its times after REREAD_T0_NS."""
    import torch

    from vllm_megakernel.megakernel import abi

    n = len(task_trace["waves"])
    rec = torch.zeros(n, len(abi.TRACE_FIELDS), dtype=torch.int64)
    rec[:, abi.TRACE_FIELDS.index("sm")] = task_trace["sm"].long()
    rec[:, abi.TRACE_FIELDS.index("smid")] = task_trace["smid"].long()
    for j, name in enumerate(task_trace["time_fields"]):
        t = task_trace["times_ns"][:, j].long()
        rec[:, abi.TRACE_FIELDS.index(name)] = torch.where(t >= 0, t + REREAD_T0_NS, 0)
    return rec


def reread(out: Path, config: dict) -> str:
    """The tables that are computed from every task's record, again, from a run's traces.pt and profile.json
    (--save-traces), without a GPU: the layer cut at its routing chain, what its period waited on, what the SMs do over a layer, the
    signal-to-run hops, the signal tails and the checks that found their inputs done. The schedule is rebuilt from
    the row's batch, schedule and the trace's SM count, and must have the trace's tasks in the trace's order."""
    import torch

    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel import trace
    from vllm_megakernel.megakernel.schedule import StepShape, build_schedule

    dims = ref.ModelDims.from_config(config)
    i_moe, i_dense = config["intermediate_size"], config.get("prefix_dense_intermediate_size") or 0
    profile = json.loads((out / "profile.json").read_text())
    rows = [r for r in profile["results"] if not r.get("placement")]  # traces.pt holds each of their records
    traces = torch.load(out / "traces.pt", weights_only=False)
    text = []
    if len(rows) == len(traces) + 1:  # the run was stopped after a row's profile.json and before its traces.pt
        text += [f"profile.json has {len(rows)} rows of the first placement and traces.pt {len(traces)}: the run "
                 f"stopped between the two saves of its last row, which is left out here", ""]
        rows = rows[:len(traces)]
    if len(traces) != len(rows):
        raise ValueError(f"{out}: {len(traces)} traces for {len(rows)} rows of the first placement")
    for r, tt in zip(rows, traces):
        shape = StepShape(batch=r["batch"], num_sms=int(tt["sm"].max()) + 1, **parse_schedule(r["schedule"]))
        sched = build_schedule(dims, shape, i_moe, i_dense)
        if [t.wave for t in sched.tasks] != tt["waves"]:
            raise ValueError(f"{out}: batch {r['batch']}'s rebuilt schedule ({len(sched.tasks)} tasks) is not the "
                             f"traced one ({len(tt['waves'])} tasks): the schedule code changed since the run")
        rec = records_of(tt)
        # the routing log's distinct experts are kept only as their mean: every MoE layer gets it
        distinct_in = {i: r["distinct_experts"] for i in range(dims.num_layers) if not dims.dense[i]}
        bins = layer_activity_of(dims, i_moe, i_dense, sched, rec, [r["context"] + 1] * r["batch"], distinct_in)
        layers = trace.middle_moe_layers(dims)
        named = f"MoE layers {layers[0]}-{layers[-1]}"
        text += [f"### batch {r['batch']}, context {r['context']}, schedule {row_label(r)}", "",
                 trace.phases_markdown(trace.layer_phases(sched, rec, layers), named),
                 trace.critical_markdown(trace.critical_path(sched, rec, layers), named),
                 trace.activity_markdown(bins, named, profile["bandwidth_bytes_per_s"]),
                 trace.hops_markdown(trace.layer_hops(sched, rec, layers), named),
                 trace.tails_markdown(trace.signal_tails(sched, rec, layers), named),
                 trace.checks_markdown(trace.input_checks(sched, rec, layers), named)]
    return "\n".join(text)


def critical_markdown_of(saved: dict, layers: str) -> str:
    """trace.critical_markdown of a CriticalPath as profile.json keeps it (dataclasses.asdict)."""
    from vllm_megakernel.megakernel.trace import CriticalPath, PathPart, critical_markdown

    path = CriticalPath(saved["period_us"], [PathPart(**x) for x in saved["parts"]],
                        [tuple(c) for c in saved["chains"]], saved["layers"])
    return critical_markdown(path, layers)


def kernel_bytes(config: dict, context: int, batch: int, distinct: float) -> float:
    """Bytes one kernel step reads at the speed of light: benchmarks.sol's step, less the LM head (vLLM's
    compute_logits reads it after the kernel; the kernel's embedding lookup reads only the batch's rows)."""
    from benchmarks.sol import ModelBytes

    mb = ModelBytes.from_config(config)
    return mb.step_bytes([context] * batch, distinct) - config["vocab_size"] * config["hidden_size"] * 2


def layer_wave_bytes(dims, moe_intermediate: int, dense_intermediate: int, layer: int, seq_lens, distinct: float,
                     wave: str) -> float | None:
    """Bytes ``wave`` must move in ``layer`` (every weight byte and every K/V byte once; activations, in L2, are
    not counted): ``seq_lens`` each request's tokens including the new one (0 for padding), ``distinct`` the
    layer's distinct experts. None where the layer has no such wave (a dense layer's router), 0 for a wave that
    moves no weights (combines, top-k, norm)."""
    if layer >= dims.num_layers:
        return 0  # the final norm's pseudo-layer: no weights streamed
    h, d = dims.hidden, dims.head_dim
    dense = dims.dense[layer]
    window = dims.sliding_window if dims.sliding[layer] else None
    tokens = sum(min(n, window) if window else n for n in seq_lens)
    n = {
        "router": None if dense else dims.num_experts * h,
        "qkv": (dims.num_heads + 2 * dims.num_kv_heads) * d * h,
        "o_proj": h * dims.num_heads * d,
        "mlp_up": 2 * dense_intermediate * h if dense else distinct * 2 * moe_intermediate * h,
        "mlp_down": h * dense_intermediate if dense else distinct * h * moe_intermediate,
        "attn_partial": tokens * 2 * dims.num_kv_heads * d,
    }.get(wave, 0)
    return None if n is None else 2 * n


def wave_bytes(config: dict, wave: str, context: int, batch: int, distinct: float) -> float:
    """Bytes a wave must move per layer, averaged over the layers that have it (layer_wave_bytes with every
    request at ``context`` cached tokens)."""
    from vllm_megakernel.reference import ModelDims

    dims = ModelDims.from_config(config)
    i_moe, i_dense = config["intermediate_size"], config.get("prefix_dense_intermediate_size") or 0
    per_layer = [b for layer in range(dims.num_layers)
                 if (b := layer_wave_bytes(dims, i_moe, i_dense, layer, [context + 1] * batch, distinct, wave))
                 is not None]
    return statistics.mean(per_layer) if per_layer else 0.0


def row_label(r: dict) -> str:
    """A row's schedule, with the weights' placement when the run timed more than one (--placements); rows of
    the first placement (0) read as a run of one placement's."""
    return r.get("schedule", "default") + (f" @ placement {r['placement']}" if r.get("placement") else "")


def clock_text(r: dict) -> str:
    """A row's clocks as 'before / after MHz (reasons after)', '?' for a reading nvidia-smi could not give."""
    before, after = (list(r.get("clocks") or []) + [None, None])[:2]
    mhz = " / ".join(str(c["sm_mhz"]) if c else "?" for c in (before, after))
    return mhz + (f" ({after['reasons']})" if after else "")


def physical_sms_markdown(physical: list[int], routing: dict) -> str:
    """Where the hardware put the blocks: the routing waves' physical SMs on one layer, and the block -> SM
    map (in runs of consecutive SMs), so that two processes' maps can be compared."""
    runs, start = [], 0
    for i in range(1, len(physical) + 1):
        if i == len(physical) or physical[i] != physical[i - 1] + 1:
            first, last = physical[start], physical[i - 1]
            runs.append(f"{start}-{i - 1}: {first}-{last}" if i - 1 > start else f"{start}: {first}")
            start = i
    waves = "; ".join(f"{w} {v}" for w, v in routing.items() if w != "layer")
    return (f"physical SMs (%smid) of layer {routing['layer']}'s routing: {waves}. Blocks -> physical SMs: "
            + ", ".join(runs))


def report(results: list[dict], bandwidth: float, config: dict) -> str:
    lines = [f"HBM copy bandwidth measured in this run: {bandwidth / 1e12:.2f} TB/s", "",
             "| batch | context | schedule | splits | tasks | step us (median) | tok/s | distinct experts/layer | "
             "GB read | GB/s | % of copy bandwidth |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        nbytes = kernel_bytes(config, r["context"], r["batch"], r["distinct_experts"])
        gbs = nbytes / (r["step_us_median"] * 1e-6) / 1e9
        lines.append(f"| {r['batch']} | {r['context']} | {row_label(r)} | {r['attn_splits']} | {r['tasks']} | "
                     f"{r['step_us_median']:.0f} | {r['batch'] / (r['step_us_median'] * 1e-6):.0f} | "
                     f"{r['distinct_experts']:.1f} | {nbytes / 1e9:.2f} | {gbs:.0f} | "
                     f"{100 * gbs * 1e9 / bandwidth:.0f}% |")
    if any(any(r.get("clocks") or []) for r in results):
        lines += ["", "SM clock before / after each row's timed launches (MHz; active clock-event reasons, "
                      "nvidia-smi's bitmask, after): " + "; ".join(
            f"batch {r['batch']} ({row_label(r)}): {clock_text(r)}" for r in results)]
    for r in results:
        lines += ["", f"### batch {r['batch']}, context {r['context']}, schedule {row_label(r)} "
                      f"({r['attn_splits']} attention splits)", "",
                  f"step wall time (traced launch): {r['traced_step_us']:.1f} us", "",
                  "| wave | opcodes | layers | tasks/layer | SMs | task run us | inputs | stages | tail | task wait us | "
                  "span us/layer | share | MB/layer | GB/s over span | % of copy |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        other = 0.0
        for w in r["waves"]:
            mb = wave_bytes(config, w["wave"], r["context"], r["batch"], r["distinct_experts"])
            gbs = mb / (w["span_us"] * 1e-6) / 1e9 if w["span_us"] > 0 else 0.0
            bw = f"{mb / 1e6:.1f} | {gbs:.0f} | {100 * gbs * 1e9 / bandwidth:.0f}%" if mb else "- | - | -"
            lines.append(f"| {w['wave']} | {w['ops']} | {w['layers']} | {w['tasks_per_layer']:.0f} | {w['sms']} | "
                         f"{w['run_us']:.1f} | {w.get('inputs_us', 0):.1f} | {w.get('stages_us', 0):.1f} | "
                         f"{w.get('tail_us', 0):.1f} | {w['wait_us']:.1f} | {w['span_us']:.1f} | "
                         f"{100 * w['share']:.0f}% | {bw} |")
            if w["wave"] not in ATTENTION_WAVES:
                other += w["span_us"] * w["layers"]
        lines += ["", f"spans of every wave but attention, summed over the step: {other / 1e3:.2f} ms"]
        if "phases" in r:  # profiles before session AG do not have the layer cut at its routing chain
            from vllm_megakernel.megakernel.trace import LayerPhases, phases_markdown

            lines += ["", phases_markdown(LayerPhases(**r["phases"]), r["timeline"]["layers"]).rstrip("\n")]
        if "critical" in r:  # nor what each layer's period waited on (session AH)
            lines += ["", critical_markdown_of(r["critical"], r["timeline"]["layers"]).rstrip("\n")]
        if "timeline" in r:  # profiles before the layer timeline existed do not have it
            from vllm_megakernel.megakernel.trace import LayerWave, timeline_markdown

            tl = r["timeline"]
            lines += ["", timeline_markdown(tl["next_layer_us"], [LayerWave(**w) for w in tl["waves"]],
                                            tl["layers"]).rstrip("\n")]
        if "ends" in r:  # nor the SMs' layer ends
            from vllm_megakernel.megakernel.trace import SMEnds, ends_markdown

            lines += ["", ends_markdown(r["ends"]["spread"], [SMEnds(**w) for w in r["ends"]["waves"]],
                                        r["timeline"]["layers"]).rstrip("\n")]
        if "after_previous" in r:  # nor the split by the SM's previous task
            from vllm_megakernel.megakernel.trace import AfterPrevious, after_previous_markdown

            lines += ["", after_previous_markdown([AfterPrevious(**w) for w in r["after_previous"]]).rstrip("\n")]
        if "activity" in r:  # nor what the SMs do over a layer (session W)
            from vllm_megakernel.megakernel.trace import ActivityBin, activity_markdown

            lines += ["", activity_markdown([ActivityBin(**b) for b in r["activity"]["bins"]],
                                            r["activity"]["layers"], bandwidth).rstrip("\n")]
        if "hops" in r:  # nor the signal-to-run hops (session X)
            from vllm_megakernel.megakernel.trace import Hop, hops_markdown

            lines += ["", hops_markdown([Hop(**h) for h in r["hops"]], r["timeline"]["layers"]).rstrip("\n")]
        if "tails" in r:  # nor the signal tails (session AB)
            from vllm_megakernel.megakernel.trace import Tail, tails_markdown

            lines += ["", tails_markdown([Tail(**x) for x in r["tails"]], r["timeline"]["layers"]).rstrip("\n")]
        if "checks" in r:  # nor the checks that found their inputs done (session AC)
            from vllm_megakernel.megakernel.trace import Check, checks_markdown

            lines += ["", checks_markdown([Check(**x) for x in r["checks"]], r["timeline"]["layers"]).rstrip("\n")]
        if "routing_physical_sms" in r:  # nor the physical SMs (ABI 12)
            lines += ["", physical_sms_markdown(r["physical_sms"], r["routing_physical_sms"])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a config dir (weights are random, made on the GPU)")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--schedules", default="default", help="';'-separated schedules to compare (see above)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--placements", type=int, default=1,
                    help="time every batch and schedule on this many placements of the same weights: after the "
                         "first, the weights are freed and made again behind a pad of a different size, so they "
                         "land at other addresses (A/B runs in separate processes have disagreed by 12-18%% at "
                         "batch 1; this tells a placement effect from one of the process)")
    ap.add_argument("--save-traces", action="store_true",
                    help="also write traces.pt (every task's record of each row's traced launch on the first "
                         "placement, about 1 MB a row at batch 1), for --reread and the trace module offline")
    ap.add_argument("--reread", type=Path, metavar="DIR",
                    help="no GPU: compute the tables that read every task's record again from DIR's traces.pt and "
                         "profile.json (a run with --save-traces), write them to DIR/reread.md and print them")
    args = ap.parse_args(argv)
    if args.reread:
        config = json.loads((Path(args.model) / "config.json").read_text())
        text = reread(args.reread, config)
        (args.reread / "reread.md").write_text(text)
        print(text)
        return
    if args.placements < 1:
        ap.error("--placements must be at least 1")

    import torch

    from benchmarks.sol import measure_bandwidth
    from vllm_megakernel import reference as ref

    config = json.loads((Path(args.model) / "config.json").read_text())
    dims = ref.ModelDims.from_config(config)
    bandwidth = measure_bandwidth()
    weights = random_weights(config, dims, args.seed)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    skipped: list[str] = []  # batches whose K/V would not fit, each with why
    schedules = [s.strip() for s in args.schedules.split(";")]
    for s in schedules:
        parse_schedule(s)  # a typo fails before minutes of GPU work
    def write(rows: list[dict]) -> str:
        """report.md and profile.json of the rows so far: rewritten after every row, so that a run stopped by
        a time limit keeps what it measured (session L lost a call's report that way)."""
        rows = [{k: v for k, v in r.items() if k != "task_trace"} for r in rows]
        text = report(rows, bandwidth, config)
        if skipped:
            text += "\n\n" + "\n".join(f"- {why}" for why in skipped) + "\n"
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "report.md").write_text(text)
            (args.out / "profile.json").write_text(json.dumps({"bandwidth_bytes_per_s": bandwidth, "config": config,
                                                               "results": rows}, indent=1))
        return text

    pad = None
    for placement in range(args.placements):
        if placement:  # the same weights again, at other addresses: a pad of a new size goes in first
            del weights
            pad = None
            torch.cuda.empty_cache()
            pad = torch.empty(placement * (1 << 30) + placement * 37 * (1 << 21), dtype=torch.uint8, device="cuda")
            weights = random_weights(config, dims, args.seed)
        for b in (int(x) for x in args.batch_sizes.split(",")):
            why = kv_does_not_fit(dims, b, args.context, torch.cuda.mem_get_info()[0])
            if why:
                print(why, flush=True)
                if why not in skipped:
                    skipped.append(why)
                    write(results)
                continue
            for s in schedules:
                results.append(profile_batch(dims, weights, b, args.context, args.iters, num_sms, args.seed, s))
                if args.placements > 1:
                    results[-1]["placement"] = placement
                print(f"batch {b}, schedule {row_label(results[-1])}: {results[-1]['step_us_median']:.0f} us per "
                      f"step; SM clock {clock_text(results[-1])}", flush=True)
                write(results)
                if args.out and args.save_traces:  # likewise the records (every schedule's, on the first
                    # placement), replaced whole: a run stopped mid-save keeps the previous rows' file
                    traces = [r["task_trace"] for r in results if not r.get("placement")]
                    torch.save(traces, args.out / "traces.pt.part")
                    os.replace(args.out / "traces.pt.part", args.out / "traces.pt")
                torch.cuda.empty_cache()
    del pad
    print(write(results))


if __name__ == "__main__":
    main()

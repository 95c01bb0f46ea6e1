"""Decode attention alone: the megakernel's attention waves against vLLM's FlashAttention 3, on the same
paged KV cache, block tables and query.

    python -m benchmarks.attention_bench --model configs/north-mini-code --batch-sizes 1,8,64 \
        --contexts 1024,8192,32768,131072 --long-context 262000 [--attn-splits 0,16] --out DIR

Per (batch, context, layer kind) -- a sliding layer (the model's window) and a full layer (the whole
history) of the model's attention shape (GQA 32/4, head dim 128): K/V drawn at random into vLLM's
FlashAttention layout (num_blocks, 2, 16, 4, 128) with each request's blocks scattered over the cache
(benchmarks' PagedKVSim), a random query, every request at the same length.

- FA3: ``vllm.vllm_flash_attn.flash_attn_varlen_func`` with the block table, ``seqused_k``, causal,
  ``window_size=(W - 1, 0)`` on sliding layers, the model's softmax scale and ``fa_version=3``, as vLLM's
  FlashAttention backend calls it for decode (without the scheduler metadata vLLM precomputes; FA3 picks
  its own split count).
- megakernel: ``schedule.attention_schedule`` -- that layer's ATTN_PARTIAL and ATTN_COMBINE waves with the
  step's default splits, or each split count of ``--attn-splits`` (0: the default) -- as a whole launch
  (barrier reset + kernel). The wave alone has nothing to overlap a second round of partial tasks with, as
  the step does (batch 8's default 17 splits make 136 tasks for 132 SMs): the splits column says which ran.

Both are captured in a CUDA graph of ``--reps`` calls and timed with CUDA events (median of ``--iters``
replays, per call), so host launch costs are out of both. The megakernel's span inside its launch (first
task start to last task end, from a traced launch) is reported too. Bytes: the K/V each side must read
once (visible tokens x K and V x KV heads x head dim x 2 bytes), against the copy bandwidth measured in the
same run. The two outputs are compared first (min cosine over rows and heads); a case whose outputs
disagree says so in the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path


def kv_bytes(batch: int, context: int, window: int | None, num_kv_heads: int, head_dim: int) -> int:
    """K/V bytes a decode step at ``context`` history must read for one layer: every visible token's K and V
    (the new token included) of every KV head, bf16, once."""
    seq = context + 1
    visible = min(seq, window) if window else seq
    return batch * visible * 2 * num_kv_heads * head_dim * 2


def attention_dims(dims):
    """The model's attention shape on two MoE layers, 0 sliding and 1 full: the kernel's layer table needs
    weights for every layer of the dims it runs, and these two are all the benchmark attends over."""
    return dataclasses.replace(dims, num_layers=2, sliding=(True, False), rope=(True, False), dense=(False, False))


def task_breakdown(schedule, records) -> dict:
    """Where a traced attention launch spent its time: the median run of a partial task with work, the partial
    work of the busiest SM (more than one task's worth when there are more partial tasks than SMs: the wave
    then lasts two task times) and the median run of a combine task, in us. A partial task past the splits in
    use returns before it marks its inputs (csrc/ops/attention.cuh): those are left out."""
    import statistics

    from vllm_megakernel.megakernel.trace import record_fields

    _, f = record_fields(records)
    run = {"attn_partial": [], "attn_combine": []}
    per_sm: dict[int, float] = {}
    for t in schedule.tasks:
        i = t.index
        if t.wave not in run or int(f["end_ns"][i]) <= 0:
            continue
        if t.wave == "attn_partial" and int(f["inputs_ns"][i]) <= 0:  # a split with no keys to attend
            continue
        us = (int(f["end_ns"][i]) - int(f["run_start_ns"][i])) / 1e3
        run[t.wave].append(us)
        if t.wave == "attn_partial":
            per_sm[int(f["sm"][i])] = per_sm.get(int(f["sm"][i]), 0.0) + us
    return {"partial_task_us": statistics.median(run["attn_partial"]),
            "busiest_sm_partial_us": max(per_sm.values()),
            "combine_task_us": statistics.median(run["attn_combine"]) if run["attn_combine"] else 0.0}


def run_case(dims, weights, batch: int, context: int, iters: int, reps: int, num_sms: int, seed: int,
             splits: int = 0) -> list[dict]:
    """Both layer kinds at one (batch, context); ``splits`` attention splits a request (0: the step's default)."""
    import torch

    from benchmarks.sol import cuda_times
    from vllm_megakernel.megakernel import runtime
    from vllm_megakernel.megakernel.schedule import StepShape, attention_schedule
    from vllm_megakernel.paged_kv import PagedKVSim
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    sim = PagedKVSim(dims, num_requests=batch, max_len=context + 1, block_size=16, dtype=torch.bfloat16,
                     device="cuda", seed=seed)
    sim.fill_history([context] * batch, values=False)
    for cache in sim.kv_caches:  # whole caches at random: the new token's K/V is in place as qkv would leave it
        cache.normal_(generator=torch.Generator(device="cuda").manual_seed(seed))
    inp = sim.step([1] * batch)
    hq, hkv, d = dims.num_heads, dims.num_kv_heads, dims.head_dim
    q = torch.randn((batch, hq, d), generator=torch.Generator(device="cuda").manual_seed(seed + 1), device="cuda",
                    dtype=torch.float32).to(torch.bfloat16)
    out = []
    for layer, kind in ((0, "sliding"), (1, "full")):
        window = dims.sliding_window if dims.sliding[layer] else None
        group = inp.groups[inp.layer_group[layer]]
        cache = inp.kv_caches[layer]
        # the wave alone, spread over every split: the step's live split cap (layout.attn_live_tasks_for) keeps
        # short histories on fewer SMs so that the rest start the expert waves, which this benchmark does not run
        shape = StepShape(batch=batch, num_sms=num_sms, attn_splits=splits, attn_live_tasks=0)
        sched = attention_schedule(dims, shape, layer, *weights.intermediates())
        step = runtime.build_step(sched, weights, inp)
        step.workspace["q"].view(-1)[: q.numel()].copy_(q.view(-1))
        traced = runtime.build_step(sched, weights, inp, workspace=step.workspace, trace=True)

        fa_out = torch.empty_like(q)
        seq_lens = inp.seq_lens.to(torch.int32)
        cu_q = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
        table = group.block_table.to(torch.int32)

        def fa3():
            flash_attn_varlen_func(q, cache[:, 0], cache[:, 1], max_seqlen_q=1, cu_seqlens_q=cu_q,
                                   max_seqlen_k=context + 1, seqused_k=seq_lens, softmax_scale=d ** -0.5,
                                   causal=True, window_size=[window - 1, 0] if window else [-1, -1],
                                   block_table=table, out=fa_out, fa_version=3)

        def mk():
            runtime.launch(step)

        fa3()
        mk()
        runtime.check(step)
        got = step.workspace["attn"].view(-1)[: batch * hq * d].view(batch, hq, d).float()
        cos = torch.nn.functional.cosine_similarity(got, fa_out.float(), dim=-1).min().item()

        def graphed(fn):
            g = torch.cuda.CUDAGraph()
            fn()  # warm
            torch.cuda.synchronize()
            with torch.cuda.graph(g):
                for _ in range(reps):
                    fn()
            return lambda: g.replay()

        fa_us = statistics.median(cuda_times(graphed(fa3), iters, warmup=2)) * 1e6 / reps
        mk_us = statistics.median(cuda_times(graphed(mk), iters, warmup=2)) * 1e6 / reps
        runtime.launch(traced)
        runtime.check(traced)
        rec = traced.trace.cpu()
        span_us = (int(rec[:, 6].max()) - int(rec[:, 2].min())) / 1e3  # first run start to last end
        out.append({"batch": batch, "context": context, "layer": kind, "window": window,
                    "attn_splits": shape.attn_splits, "tasks": len(sched.tasks),
                    "kv_bytes": kv_bytes(batch, context, window, hkv, d), "fa3_us": fa_us, "megakernel_us": mk_us,
                    "megakernel_span_us": span_us, "min_cosine": cos, **task_breakdown(sched, rec)})
        del step, traced
    del sim, inp
    torch.cuda.empty_cache()
    return out


def table(results: dict) -> str:
    bw = results["bandwidth_bytes_per_s"]
    lines = [f"HBM copy bandwidth measured in this run: {bw / 1e12:.2f} TB/s. Times per call (CUDA graph of "
             f"{results['reps']} calls, median of {results['iters']} replays); megakernel span: first task start to "
             "last task end inside its launch (traced); from the same traced launch, the median partial and combine "
             "task and the busiest SM's partial tasks together.", "",
             "| batch | context | layer | splits | MB K/V | FA3 us | FA3 % copy | megakernel us | megakernel % copy | "
             "megakernel span us | megakernel / FA3 | outputs (min cosine) | partial task us | busiest SM's "
             "partials us | combine task us |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in results["cases"]:
        mb = c["kv_bytes"] / 1e6

        def pct(us):
            return f"{100 * c['kv_bytes'] / (us * 1e-6) / bw:.0f}%"

        agree = f"{c['min_cosine']:.5f}" if c["min_cosine"] >= 0.999 else f"DISAGREE {c['min_cosine']:.4f}"
        lines.append(f"| {c['batch']} | {c['context']} | {c['layer']} | {c['attn_splits']} | {mb:.1f} | "
                     f"{c['fa3_us']:.1f} | {pct(c['fa3_us'])} | {c['megakernel_us']:.1f} | {pct(c['megakernel_us'])} | "
                     f"{c['megakernel_span_us']:.1f} | {c['megakernel_us'] / c['fa3_us']:.2f}x | {agree} | "
                     + " | ".join(f"{c[k]:.1f}" if k in c else "-"  # columns added after session J's first run
                                  for k in ("partial_task_us", "busiest_sm_partial_us", "combine_task_us")) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a config dir (weights are random, made on the GPU)")
    ap.add_argument("--batch-sizes", default="1,8,64")
    ap.add_argument("--contexts", default="1024,8192,32768,131072")
    ap.add_argument("--long-context", type=int, default=0, help="one more context, at batch 1 only (256K)")
    ap.add_argument("--max-cache-gb", type=float, default=40.0,
                    help="skip a (batch, context) whose two layers' caches would need more")
    ap.add_argument("--attn-splits", default="0",
                    help="comma-separated split counts a request, each timed at every grid point (0: the default)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import sys

    import torch

    from benchmarks.kernel_profile import random_weights
    from benchmarks.sol import measure_bandwidth
    from vllm_megakernel.megakernel.layout import ATTN_TILE
    from vllm_megakernel.reference import ModelDims

    config = json.loads((Path(args.model) / "config.json").read_text())
    dims = attention_dims(ModelDims.from_config(config))
    weights = random_weights(config, dims)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    bandwidth = measure_bandwidth()
    grid = [(b, c) for b in map(int, args.batch_sizes.split(",")) for c in map(int, args.contexts.split(","))]
    if args.long_context:
        grid.append((1, args.long_context))
    cases, skipped = [], []
    command = " ".join([Path(sys.executable).name, "-m", "benchmarks.attention_bench"] + sys.argv[1:])

    def save() -> str:
        """Results so far, written after every grid point: a run cut short by its time limit keeps them."""
        results = {"command": command, "gpu": torch.cuda.get_device_name(), "bandwidth_bytes_per_s": bandwidth,
                   "iters": args.iters, "reps": args.reps, "cases": cases, "skipped": skipped}
        text = table(results)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "results.json").write_text(json.dumps(results, indent=1))
            (args.out / "table.md").write_text(text)
        return text

    for b, c in grid:
        # two full-history caches, the new token's block included
        need = 2 * kv_bytes(b, c + ATTN_TILE, None, dims.num_kv_heads, dims.head_dim) / 1e9
        if need > args.max_cache_gb:
            skipped.append({"batch": b, "context": c, "reason": f"caches need {need:.0f} GB > --max-cache-gb"})
            continue
        for splits in map(int, args.attn_splits.split(",")):
            cases += run_case(dims, weights, b, c, args.iters, args.reps, num_sms, args.seed, splits)
        save()
        print(f"batch {b} context {c}: done", flush=True)
    print(save())


if __name__ == "__main__":
    main()

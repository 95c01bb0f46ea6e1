"""Where the megakernel's decode step spends its time: the kernel alone (no vLLM, no LM head), the whole
model on random weights, a per-wave breakdown from a traced launch.

    python -m benchmarks.kernel_profile --model configs/north-mini-code --batch-sizes 1,8 --context 8192 \
        [--tile-n 128,64,32]

Per batch size: the median step time of --iters untraced launches (CUDA events), the bytes the step read
(weights of the experts the kernel actually chose, from its routing log, plus the KV it attended over) and
the bandwidth that is, against the copy bandwidth measured in the same run; then megakernel.trace's table
of one traced launch (task run and wait times, per-layer span and share of the step per wave). This is the
tool for deciding what v2 changes; end-to-end speed against stock vLLM comes from benchmarks.decode_sweep.
Several --tile-n values (output columns per GEMM task; the kernel reads it from the step table) compare
schedules in one run: fewer columns per task spread a wave over more SMs at more per-task overhead.
With --out the report is also written there (report.md, profile.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path


def profile_batch(dims, weights, batch: int, context: int, iters: int, num_sms: int, seed: int,
                  tile_n: int = 128) -> dict:
    import torch

    from benchmarks.sol import cuda_times
    from vllm_megakernel.megakernel import runtime, trace
    from vllm_megakernel.megakernel.schedule import StepShape, attn_splits_for, build_schedule
    from vllm_megakernel.paged_kv import PagedKVSim

    sim = PagedKVSim(dims, num_requests=batch, max_len=context + 1, block_size=16, dtype=torch.bfloat16,
                     device="cuda", seed=seed)
    sim.fill_history([context] * batch, values=False)
    for cache in sim.kv_caches:  # whole caches at once; the values only need to be finite
        cache.normal_()
    gen = torch.Generator().manual_seed(seed)
    inp = sim.step([int(torch.randint(0, dims.vocab, (1,), generator=gen)) for _ in range(batch)])
    splits = attn_splits_for(context + 1, batch=batch, num_kv_heads=dims.num_kv_heads, num_sms=num_sms)
    sched = build_schedule(dims, StepShape(batch=batch, num_sms=num_sms, tile_n=tile_n, attn_splits=splits),
                           *weights.intermediates())

    plain = runtime.build_step(sched, weights, inp)
    times = [t * 1e6 for t in cuda_times(lambda: runtime.launch(plain), iters, warmup=3)]  # us
    runtime.check(plain)

    traced = runtime.build_step(sched, weights, inp, route_log=True, trace=True)
    runtime.launch(traced)
    runtime.check(traced)
    step_us, rows = trace.summarize(sched, traced.trace)
    chosen = runtime.routing_log(traced.workspace, dims, batch)
    moe = [i for i in range(dims.num_layers) if not dims.dense[i]]
    distinct = statistics.mean(len(set(chosen[i].flatten().tolist())) for i in moe)
    return {"batch": batch, "context": context, "tile_n": tile_n, "attn_splits": splits, "tasks": len(sched.tasks),
            "step_us_median": statistics.median(times), "step_us_min": min(times),
            "traced_step_us": step_us, "distinct_experts": distinct,
            "waves": [dataclasses.asdict(r) for r in rows]}


def kernel_bytes(config: dict, context: int, batch: int, distinct: float) -> float:
    """Bytes one kernel step reads at the speed of light: benchmarks.sol's step, less the LM head (vLLM's
    compute_logits reads it after the kernel; the kernel's embedding lookup reads only the batch's rows)."""
    from benchmarks.sol import ModelBytes

    mb = ModelBytes.from_config(config)
    return mb.step_bytes([context] * batch, distinct) - config["vocab_size"] * config["hidden_size"] * 2


def report(results: list[dict], bandwidth: float, config: dict) -> str:
    from vllm_megakernel.megakernel import trace

    lines = [f"HBM copy bandwidth measured in this run: {bandwidth / 1e12:.2f} TB/s", "",
             "| batch | context | tile_n | splits | tasks | step us (median) | tok/s | distinct experts/layer | "
             "GB read | GB/s | % of copy bandwidth |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        nbytes = kernel_bytes(config, r["context"], r["batch"], r["distinct_experts"])
        gbs = nbytes / (r["step_us_median"] * 1e-6) / 1e9
        lines.append(f"| {r['batch']} | {r['context']} | {r['tile_n']} | {r['attn_splits']} | {r['tasks']} | "
                     f"{r['step_us_median']:.0f} | {r['batch'] / (r['step_us_median'] * 1e-6):.0f} | "
                     f"{r['distinct_experts']:.1f} | {nbytes / 1e9:.2f} | {gbs:.0f} | "
                     f"{100 * gbs * 1e9 / bandwidth:.0f}% |")
    for r in results:
        rows = [trace.WaveTime(**w) for w in r["waves"]]
        lines += ["", f"### batch {r['batch']}, context {r['context']}, tile_n {r['tile_n']}", "",
                  trace.markdown(r["traced_step_us"], rows)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a config dir (weights are random, made on the GPU)")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--tile-n", default="128", help="comma-separated GEMM tile widths to compare")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import torch

    from benchmarks.sol import measure_bandwidth
    from vllm_megakernel import reference as ref

    config = json.loads((Path(args.model) / "config.json").read_text())
    dims = ref.ModelDims.from_config(config)
    moe_i = config["intermediate_size"]
    dense_i = config.get("prefix_dense_intermediate_size") or 0
    bandwidth = measure_bandwidth()
    weights = ref.Weights.random(dims, moe_i, dense_i, "cuda", seed=args.seed)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for b in (int(x) for x in args.batch_sizes.split(",")):
        for tile in (int(x) for x in args.tile_n.split(",")):
            results.append(profile_batch(dims, weights, b, args.context, args.iters, num_sms, args.seed, tile))
            print(f"batch {b}, tile_n {tile}: {results[-1]['step_us_median']:.0f} us per step", flush=True)
            torch.cuda.empty_cache()
    text = report(results, bandwidth, config)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.md").write_text(text)
        (args.out / "profile.json").write_text(json.dumps({"bandwidth_bytes_per_s": bandwidth, "config": config,
                                                           "results": results}, indent=1))
    print(text)


if __name__ == "__main__":
    main()

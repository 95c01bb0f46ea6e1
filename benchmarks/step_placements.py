"""Does where a step's own buffers land move its time? Batch 1's kernel-alone step has differed by 10-13%
between runs of one schedule (PERF_LOG #57-#58), more than any change looked for at batch 1; the traces
of slow runs differ in the small dependent reads (router inputs, combine, O projection), not the streams.

    python -m benchmarks.step_placements --model configs/north-mini-code --batch-size 1 --steps 6 \
        --rounds 5 --iters 20 [--context 8192] [--out DIR]

Builds ``--steps`` steps of one schedule over the same weights and KV cache, each with its own workspace,
barriers, error word, tables and copies of the small input buffers (positions, lengths, block tables, slot
mappings), all allocated in a memory pool of the step's own behind a pad of a different size: so each step's
small buffers sit in segments (physical pages) of their own, not at other offsets of the caching allocator's
shared small-buffer segments. Then times them in rounds: every round times each step ``--iters`` launches
(median of the round). If the steps differ by more than each step's rounds do, the placement of a step's own
buffers moves its time, and choosing among a few placements at start-up would pay. Not varied: the weights,
the KV cache and the kernel's code. Each launch's time includes the barrier reset and the launch's host
enqueue, as in kernel_profile (the same for every step). The SM clock before and after the rounds is
recorded: a throttled round inflates the spread within a step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
from pathlib import Path


def placement_spread(round_medians: list[list[float]]) -> dict:
    """``round_medians[s][r]``: step s's median in round r. Returns each step's median over its rounds,
    ``between`` (the spread of those, max - min over their mean) and ``within`` (the largest spread of one
    step's rounds, max - min over that step's median)."""
    if not round_medians or any(not r for r in round_medians):
        raise ValueError("every step needs at least one round")
    per_step = [statistics.median(r) for r in round_medians]
    between = (max(per_step) - min(per_step)) / statistics.mean(per_step)
    within = max((max(r) - min(r)) / statistics.median(r) for r in round_medians)
    return {"per_step_us": per_step, "between": between, "within": within}


def report(round_medians: list[list[float]], batch: int, context: int) -> str:
    s = placement_spread(round_medians)
    lines = [f"batch {batch}, context {context}: {len(round_medians)} placements of the step's own buffers, "
             f"{len(round_medians[0])} rounds each", "",
             "| placement | median over rounds (us) | rounds (us) |", "|---|---|---|"]
    for i, (m, r) in enumerate(zip(s["per_step_us"], round_medians)):
        lines.append(f"| {i} | {m:.0f} | {' / '.join(f'{x:.0f}' for x in r)} |")
    verdict = ("the placements differ by more than their own rounds do" if s["between"] > 2 * s["within"]
               else "the placements differ no more than twice their own rounds do")
    lines += ["", f"spread between placements {100 * s['between']:.1f}%, largest within one placement "
                  f"{100 * s['within']:.1f}%: {verdict}"]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a config dir (weights are random, made on the GPU)")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.steps < 2 or args.rounds < 1 or args.iters < 1:
        ap.error("--steps must be at least 2, --rounds and --iters at least 1")

    import torch

    from benchmarks.kernel_profile import gpu_clocks, random_step_inputs, random_weights
    from benchmarks.sol import cuda_times
    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel import runtime
    from vllm_megakernel.megakernel.schedule import StepShape, build_schedule

    config = json.loads((Path(args.model) / "config.json").read_text())
    dims = ref.ModelDims.from_config(config)
    weights = random_weights(config, dims, args.seed)
    b = args.batch_size
    inp = random_step_inputs(dims, b, args.context, args.seed)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    sched = build_schedule(dims, StepShape(batch=b, num_sms=num_sms), *weights.intermediates())
    # a pool of its own per step where this torch has them (2.5 and later); else only the pads move them
    own_pools = hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")
    steps, keep = [], []
    for i in range(args.steps):
        pool = torch.cuda.MemPool() if own_pools else None
        with torch.cuda.use_mem_pool(pool) if own_pools else contextlib.nullcontext():
            pad = torch.empty((i + 1) * 37 * 4096, dtype=torch.uint8, device="cuda")
            own = dataclasses.replace(
                inp, input_ids=inp.input_ids.clone(), positions=inp.positions.clone(), seq_lens=inp.seq_lens.clone(),
                groups=[dataclasses.replace(g, block_table=g.block_table.clone(), slot_mapping=g.slot_mapping.clone())
                        for g in inp.groups])
            steps.append(runtime.build_step(sched, weights, own))
        keep.append((pool, pad, own))
    for step in steps:
        runtime.run_step(step)  # each once, checked, before any timing
    clocks = [gpu_clocks()]
    round_medians: list[list[float]] = [[] for _ in steps]
    for _ in range(args.rounds):
        for i, step in enumerate(steps):
            times = cuda_times(lambda: runtime.launch(step), args.iters, warmup=2)
            round_medians[i].append(statistics.median(times) * 1e6)
    clocks.append(gpu_clocks())
    for step in steps:
        runtime.check(step)
    text = (report(round_medians, b, args.context) + f"\n\nSM clock before / after the rounds: {clocks}; each step's "
            f"buffers in a memory pool of its own: {'yes' if own_pools else 'no (this torch has none)'}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.md").write_text(text + "\n")
        (args.out / "placements.json").write_text(json.dumps(
            {"batch": b, "context": args.context, "round_medians_us": round_medians, "clocks": clocks,
             "own_pools": own_pools, "addresses": [{name: t.data_ptr() for name, t in s.workspace.items()} for s in steps]}, indent=1))
    print(text)


if __name__ == "__main__":
    main()

"""Schedules compared on the CPU with megakernel.timing's model, before any GPU time is spent on them.

    python -m benchmarks.schedule_model --model configs/north-mini-code \
        --profile benchmarks/results/h200-2026-12-02-v2-routing-chain-attention-bench/confirm-1/profile.json \
        --batch-sizes 1,2 --schedules "default;order=combine_before_experts"

Per batch size: the task run time of every wave is taken from the profile's row for that batch that ran the
tasks today's default builds (its default then, or a row naming tile sizes or a split count that are today's;
a traced launch on the GPU); each schedule (kernel_profile's --schedules syntax) is built for the full machine
and run through the model; the table gives the modelled MoE-layer period (median over the middle MoE layers, as
kernel_profile's timeline), its change against the modelled default, and the period the profile measured for
that row. Expert slots in use: the profile's mean distinct experts per layer, rounded, on every MoE layer. The
model knows dependencies, placement and claims and nothing of bandwidth (see megakernel.timing): trust it for
where tasks wait on one another, not for bytes in flight. `--paths` adds each schedule's modelled critical path
(megakernel.trace.critical_path on the model's run). `--fluid` runs megakernel.fluid's bandwidth-aware model
instead, which times changed task sizes too (PERF_LOG #161 compares it with measured A/Bs: right in sign on 11 of
20, wrong on batch 1's routing chain, on dealing by layer and on several effects under 3%).
Schedules that change task sizes (tiles, splits, heads per combine, the norm's form) are refused: the
profile's durations are for its own sizes, and so is a profile with no row of today's default tasks (another
SM count, other defaults since). Against the measured layers of wgr-2 (h200-2026-12-01-v2-warpgroup-registers,
the defaults of then) the modelled default is 7% short at batch 1 and 2, 1% short at 4 and 4% long at 8
(PERF_LOG #48); against session J's batch-1 rows of today's default 6% and 8% short (PERF_LOG #55).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path


# Choices that change what a task does (its size, or which rows or columns it takes), not where or when it runs:
# the profile's durations do not hold for them.
SIZE_CHOICES = {"tiles", "attn_splits", "attn_min_tiles", "attn_live_tasks", "attn_max_tiles", "combine_heads", "norm",
                "moe_combine_cols", "combine_in_norm", "qkv_batch_split", "o_batch_split"}
# Choices a profile row may spell today's default sizes with: the tiles and the split count, which the row
# records and which are compared. attn_min_tiles, combine_heads and norm are not recorded (16-tile splits
# build as many tasks as the default and time differently), so a row naming them never stands for the default.
DEFAULT_NAMING_CHOICES = {"tiles", "attn_splits"}


def model_rows(config: dict, profile: dict, batches: list[int], schedules: list[str], num_sms: int,
               hop_us: float, gap_us: float, paths: bool = False, fluid_model: bool = False,
               bandwidth_scale: float = 1.0) -> list[dict]:
    from benchmarks.kernel_profile import parse_schedule
    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel import fluid, timing, trace
    from vllm_megakernel.megakernel.schedule import StepShape, build_schedule

    dims = ref.ModelDims.from_config(config)
    moe_i, dense_i = config["intermediate_size"], config.get("prefix_dense_intermediate_size") or 0
    middle = trace.middle_moe_layers(dims)  # the layers kernel_profile's measured timeline reads
    rows = []
    for b in batches:
        # the durations are for the profile's own task sizes: the row must have measured the tasks that
        # today's default builds (its "default" then, or a row whose choices are today's default sizes)
        own = build_schedule(dims, StepShape(batch=b, num_sms=num_sms), moe_i, dense_i)
        mine = (own.shape.attn_splits, dataclasses.asdict(own.tiles), len(own.tasks))
        candidates = [r for r in profile["results"] if r["batch"] == b and not r.get("placement")]
        measured = next((r for r in candidates
                         if (r.get("attn_splits"), r.get("tiles"), r.get("tasks")) == mine
                         and set(parse_schedule(r.get("schedule", "default"))) <= DEFAULT_NAMING_CHOICES), None)
        if measured is None:
            raise ValueError(f"batch {b}: no row of the profile ran the tasks of the default schedule here "
                             f"({own.shape.attn_splits} splits, {len(own.tasks)} tasks on {num_sms} SMs): "
                             "its durations would not fit")
        durations = timing.durations_from_profile(measured)
        costs = fluid.costs_from_profile(measured) if fluid_model else None
        live = min(own.num_slots, round(measured["distinct_experts"]))  # the routing's mean slots in use
        base = base_step = None
        for s in schedules:
            choices = parse_schedule(s)
            if set(choices) & SIZE_CHOICES and not fluid_model:
                raise ValueError(f"schedule {s!r} changes task sizes ({sorted(set(choices) & SIZE_CHOICES)}): the "
                                 "model would time its tasks with the profile's durations for other sizes")
            sched = build_schedule(dims, StepShape(batch=b, num_sms=num_sms, **choices), moe_i, dense_i)
            if fluid_model:  # each task's bytes at the profile's context; its fixed costs are its wave's
                nbytes = fluid.task_bytes(sched, [measured.get("context", 0) + 1] * b, moe_i, dense_i)
                timed = fluid.fluid_timeline(sched, costs, nbytes, hop_us=hop_us, gap_us=gap_us,
                                             bandwidth_scale=bandwidth_scale, live_slots=lambda layer: live)
            else:
                timed = timing.timeline(sched, durations, hop_us=hop_us, gap_us=gap_us, live_slots=lambda layer: live)
            period = timed.layer_period(sched, middle)
            base = period if base is None else base
            step = max(e for e in timed.end if e == e)
            rows.append({"batch": b, "schedule": s, "model_layer_us": period, "vs_first": period / base - 1,
                         "model_step_us": step, "measured_default_layer_us": measured.get("timeline", {}).get("next_layer_us"),
                         "measured_default_step_us": measured.get("step_us_median")})
            base_step = step if base_step is None else base_step
            if fluid_model:  # the step: what an A/B measures
                rows[-1]["step_vs_first"] = step / base_step - 1
            if paths:
                tails = {w: c.tail_us for w, c in costs.items()} if fluid_model else None
                rows[-1]["critical"] = trace.critical_path(sched, timed.records(sched, tails), middle)
    return rows


def table(rows: list[dict], schedules: list[str]) -> str:
    if rows and "step_vs_first" in rows[0]:  # the fluid model: the step, as an A/B times it, and the layer
        lines = [f"| batch | schedule | modelled step us | against {schedules[0]} | modelled layer us | measured step / "
                 "layer us (the profile's row of today's default tasks) |", "|---|---|---|---|---|---|"]
        for r in rows:
            ms, ml = r.get("measured_default_step_us"), r["measured_default_layer_us"]
            lines.append(f"| {r['batch']} | {r['schedule']} | {r['model_step_us']:.0f} | {100 * r['step_vs_first']:+.1f}% | "
                         f"{r['model_layer_us']:.1f} | {'-' if ms is None else f'{ms:.0f}'} / "
                         f"{'-' if ml is None else f'{ml:.1f}'} |")
        return "\n".join(lines) + "\n"
    lines = [f"| batch | schedule | modelled layer us | against {schedules[0]} | measured layer us (the profile's row "
             "of today's default tasks) |", "|---|---|---|---|---|"]
    for r in rows:
        measured = r["measured_default_layer_us"]
        lines.append(f"| {r['batch']} | {r['schedule']} | {r['model_layer_us']:.1f} | {100 * r['vs_first']:+.1f}% | "
                     f"{'-' if measured is None else f'{measured:.1f}'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a config dir")
    ap.add_argument("--profile", type=Path, required=True, help="a kernel_profile profile.json with default rows")
    ap.add_argument("--batch-sizes", default="1")
    ap.add_argument("--schedules", default="default", help="';'-separated, the first the reference")
    ap.add_argument("--num-sms", type=int, default=132)
    ap.add_argument("--hop-us", type=float, help="a barrier's last signal to a waiter's start (default 1.0, 0.7 with "
                    "--fluid)")
    ap.add_argument("--gap-us", type=float, default=0.3, help="between two tasks of one SM")
    ap.add_argument("--fluid", action="store_true",
                    help="megakernel.fluid's model instead (bytes per task, the HBM's curve, the ring, the claims at "
                         "the producer): task sizes may change; the table gives the modelled step")
    ap.add_argument("--paths", action="store_true",
                    help="also each schedule's modelled critical path (megakernel.trace.critical_path on the model's "
                         "run; a task that started one hop after a signal that came within gap - hop of its SM's "
                         "previous task reads as queued there)")
    ap.add_argument("--scale-bandwidth", action="store_true",
                    help="with --fluid: scale the HBM's curve by the profile's measured copy bandwidth against the "
                         "probe GPU's (fluid.bandwidth_scale_for; an H100 profile: 0.70). Off: the curve as measured "
                         "on the H200, as PERF_LOG #161's comparison ran")
    args = ap.parse_args(argv)
    config = json.loads((Path(args.model) / "config.json").read_text())
    schedules = [s.strip() for s in args.schedules.split(";")]
    if args.scale_bandwidth and not args.fluid:
        ap.error("--scale-bandwidth needs --fluid (the other model has no bandwidth)")
    profile = json.loads(args.profile.read_text())
    from vllm_megakernel.megakernel.fluid import bandwidth_scale_for

    rows = model_rows(config, profile, [int(x) for x in args.batch_sizes.split(",")],
                      schedules, args.num_sms, args.hop_us if args.hop_us is not None else 0.7 if args.fluid else 1.0,
                      args.gap_us, paths=args.paths, fluid_model=args.fluid,
                      bandwidth_scale=bandwidth_scale_for(profile) if args.scale_bandwidth else 1.0)
    print(table(rows, schedules), end="")
    if args.paths:
        from vllm_megakernel.megakernel.trace import critical_markdown

        for r in rows:
            print(f"\n### batch {r['batch']}, {r['schedule']} (modelled)\n")
            print(critical_markdown(r["critical"], "the middle MoE layers"), end="")


if __name__ == "__main__":
    main()

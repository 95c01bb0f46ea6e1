"""Each wave's fixed costs one at a time in megakernel.fluid's model (the kernel's form): the step with that wave's
inputs phase, finish, tail, or all three at 0, against the profiled costs (PERF_LOG #206). Not a measurement: where
batch 1's chain of dependent phases is, wave by wave.

    python benchmarks/results/cpu-2026-12-06-session-at-consumer-groups/fluid_per_wave.py PROFILE_JSON BATCH [--scale]

PROFILE_JSON: a kernel_profile profile.json (session AR's H200 call 12, session AS's H100 call 3, both in their
folders' raw.tar.xz); --scale: the HBM curve scaled to the profile's copy bandwidth (an H100's)."""
import dataclasses
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
from vllm_megakernel import reference as ref  # noqa: E402
from vllm_megakernel.megakernel import fluid  # noqa: E402
from vllm_megakernel.megakernel.schedule import StepShape, build_schedule  # noqa: E402

prof = json.load(open(sys.argv[1]))
b = int(sys.argv[2])
scale = fluid.bandwidth_scale_for(prof) if "--scale" in sys.argv else 1.0
config = json.loads((REPO / "configs/north-mini-code/config.json").read_text())
dims = ref.ModelDims.from_config(config)
moe_i, dense_i = config["intermediate_size"], config.get("prefix_dense_intermediate_size") or 0
row = next(r for r in prof["results"] if r["batch"] == b and r.get("schedule", "default") == "default")
print(f"profile row: batch {b}, measured step {row['step_us_median']:.0f} us; HBM curve x{scale:.2f}")
sched = build_schedule(dims, StepShape(batch=b, num_sms=132), moe_i, dense_i)
base = fluid.costs_from_profile(row)
nbytes = fluid.task_bytes(sched, [row.get("context", 0) + 1] * b, moe_i, dense_i)
live = min(sched.num_slots, round(row["distinct_experts"]))


def step(costs):
    timed = fluid.fluid_timeline(sched, costs, nbytes, live_slots=lambda layer: live, hop_us=0.7, gap_us=0.3,
                                 bandwidth_scale=scale)
    return max(e for e in timed.end if e == e)


s0 = step(base)
print(f"modelled step {s0:.0f} us\n\n| wave (inputs / finish / tail us) | inputs 0 | finish 0 | tail 0 | all three 0 |\n"
      "|---|---|---|---|---|")
for w, c in sorted(base.items()):
    cells = []
    for fields in (("inputs_us",), ("finish_us",), ("tail_us",), ("inputs_us", "finish_us", "tail_us")):
        costs = dict(base)
        costs[w] = dataclasses.replace(c, **{f: 0.0 for f in fields})
        cells.append(f"{100 * (step(costs) / s0 - 1):+.1f}%")
    print(f"| {w} ({c.inputs_us:.1f} / {c.finish_us:.1f} / {c.tail_us:.1f}) | " + " | ".join(cells) + " |", flush=True)

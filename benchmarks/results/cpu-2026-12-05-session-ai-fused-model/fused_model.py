# Run from the repository root after: mkdir -p /tmp/raw2 && tar xJf benchmarks/results/h100-2026-12-05-session-ai/raw.tar.xz -C /tmp/raw2
#   python benchmarks/results/cpu-2026-12-05-session-ai-fused-model/fused_model.py PROFILE_JSON BATCH
"""The fused expert task in the fluid model, by rewiring today's schedule: each up/gate task also streams its
slot slice of W2 and signals the layer's down barrier; every down task is skipped (as a dead slot's is)."""
import sys, json, copy, dataclasses
sys.path.insert(0, '.')
from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel.schedule import StepShape, build_schedule, Op
from vllm_megakernel.megakernel import fluid, timing
from benchmarks.kernel_profile import parse_schedule
config = json.load(open('configs/north-mini-code/config.json'))
dims = ref.ModelDims.from_config(config)
moe_i, dense_i = config["intermediate_size"], config.get("prefix_dense_intermediate_size") or 0
prof = json.load(open(sys.argv[1])); B = int(sys.argv[2])
scale = fluid.bandwidth_scale_for(prof)
row = next(r for r in prof["results"] if r["batch"] == B and r.get("schedule", "default") == "default")
costs = fluid.costs_from_profile(row)
live = round(row["distinct_experts"]); ctx = row.get("context", 0) + 1
real_dead = fluid.dead_tasks

def run(sched, nb, extra_dead=(), label="", cst=costs):
    fluid.dead_tasks = lambda s, ls: real_dead(s, ls) | set(extra_dead)
    try:
        timed = fluid.fluid_timeline(sched, cst, nb, bandwidth_scale=scale, live_slots=lambda l: live)
    finally:
        fluid.dead_tasks = real_dead
    step = max(e for e in timed.end if e == e)
    return step, timed.layer_period(sched, range(2, 47))

base = build_schedule(dims, StepShape(batch=B, num_sms=132), moe_i, dense_i)
s0, p0 = run(base, fluid.task_bytes(base, [ctx] * B, moe_i, dense_i))
print(f"batch {B}: default modelled {s0:.0f} us (layer {p0:.1f}); measured {row['step_us_median']:.0f}")
for cols, overfetch in ((32, 1.0), (32, 2.0), (48, 1.0), (48, 4 / 3), (64, 1.0)):
    sched = build_schedule(dims, StepShape(batch=B, num_sms=132, **parse_schedule(f"moe_up_cols={cols}")), moe_i, dense_i)
    sched = copy.deepcopy(sched)
    nb = fluid.task_bytes(sched, [ctx] * B, moe_i, dense_i)
    downs = [t.index for t in sched.tasks if t.op == Op.MOE_DOWN]
    down_bar = {}
    for t in sched.tasks:
        if t.op == Op.MOE_DOWN:
            down_bar[t.layer] = t.signal
    for t in sched.tasks:
        if t.op == Op.MOE_UPGATE:
            t.signal = down_bar[t.layer]
            sched.barriers[t.signal].target += 1
            nb[t.index] += overfetch * dims.hidden * cols * 2  # the W2 slice
    cst = dict(costs)
    up, dn = costs["mlp_up"], costs["mlp_down"]
    cst["mlp_up"] = dataclasses.replace(up, finish_us=up.finish_us + dn.finish_us)  # the down partial's store
    s, p = run(sched, nb, downs, cst=cst)
    print(f"  fused, {cols} columns a task (W2 slice bytes x{overfetch:.2f}): {s:.0f} us ({100*(s/s0-1):+.1f}%), layer {p:.1f}")

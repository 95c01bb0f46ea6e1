# Run from the repository root:
#   python benchmarks/results/cpu-2026-12-05-session-al-last-arriver-model/la_model.py \
#     benchmarks/results/h100-2026-12-05-session-ak/noflag-tests/profile/profile.json BATCH
"""The attention combine folded into the last partial of each group (last-arriver), in the fluid model: every
ATTN_COMBINE task is left in its SM's list as an empty task (no wait, no signal, no cost), each ATTN_PARTIAL signals
the barrier the combine tasks signalled (whose target becomes the partials' count), and the partials' finish grows by
EXTRA us (the atomic, and on average the last arriver's combine work)."""
import sys, json, copy, dataclasses
sys.path.insert(0, '.')
from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel.schedule import StepShape, build_schedule, Op, NO_BARRIER
from vllm_megakernel.megakernel import fluid
config = json.load(open('configs/north-mini-code/config.json'))
dims = ref.ModelDims.from_config(config)
moe_i, dense_i = config["intermediate_size"], config.get("prefix_dense_intermediate_size") or 0
prof = json.load(open(sys.argv[1])); B = int(sys.argv[2])
scale = fluid.bandwidth_scale_for(prof)
row = next(r for r in prof["results"] if r["batch"] == B and r.get("schedule", "default") == "default")
costs = fluid.costs_from_profile(row)
live = round(row["distinct_experts"]); ctx = row.get("context", 0) + 1

def run(sched, nb, cst=costs):
    timed = fluid.fluid_timeline(sched, cst, nb, bandwidth_scale=scale, live_slots=lambda l: live)
    step = max(e for e in timed.end if e == e)
    return step, timed.layer_period(sched, range(2, 47))

base = build_schedule(dims, StepShape(batch=B, num_sms=132), moe_i, dense_i)
s0, p0 = run(base, fluid.task_bytes(base, [ctx] * B, moe_i, dense_i))
print(f"batch {B}: default modelled {s0:.0f} us (layer {p0:.1f}); measured {row['step_us_median']:.0f}")
print("  costs attn_partial", costs["attn_partial"], "\n  attn_combine", costs["attn_combine"])
for extra in (0.0, 0.5, 1.0, 2.0):
    sched = copy.deepcopy(base)
    nb = fluid.task_bytes(sched, [ctx] * B, moe_i, dense_i)
    combines = [t for t in sched.tasks if t.op == Op.ATTN_COMBINE]
    # which barrier each partial's group combine signals: the combines wait on the partials' barrier
    by_wait = {}
    for t in combines:
        for w in t.waits:
            by_wait.setdefault(w, set()).add(t.signal)
    for t in combines:  # the combine task stays in its SM's list as an empty task: no wait, no signal, no cost
        sched.barriers[t.signal].target -= 1
        t.waits, t.signal = (), NO_BARRIER
    moved = 0
    for t in sched.tasks:
        if t.op == Op.ATTN_PARTIAL and t.signal in by_wait:
            (sig,) = by_wait[t.signal]
            t.signal = sig
            sched.barriers[sig].target += 1
            moved += 1
    cst = dict(costs)
    ap = costs["attn_partial"]
    cst["attn_partial"] = dataclasses.replace(ap, finish_us=ap.finish_us + extra)
    cst["attn_combine"] = fluid.WaveCost(0.0, 0.0, 0.0, 0.0)
    s, p = run(sched, nb, cst=cst)
    print(f"  last-arriver combine, partials +{extra:.1f} us: {s:.0f} us ({100*(s/s0-1):+.1f}%), layer {p:.1f} ({moved} partials rewired)")

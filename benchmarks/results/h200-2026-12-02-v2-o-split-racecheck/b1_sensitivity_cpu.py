# Session N, CPU: python3 benchmarks/results/h200-2026-12-02-v2-o-split-racecheck/b1_sensitivity_cpu.py (from the checkout root)
# Session N, CPU: how batch 1's modelled MoE-layer period moves when one wave's task run time shrinks
# (megakernel.timing over call 3's base-1 trace durations; the model has no bandwidth, see its docstring).
import json
from pathlib import Path
from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel.schedule import StepShape, build_schedule
from vllm_megakernel.megakernel import timing
prof = json.loads(Path("benchmarks/results/h200-2026-12-02-v2-o-split-racecheck/call3/ab/base-1/profile.json").read_text())
config = prof["config"]; dims = ref.ModelDims.from_config(config)
row = [r for r in prof["results"] if r["batch"] == 1][0]
dur = timing.durations_from_profile(row)
sched = build_schedule(dims, StepShape(batch=1, num_sms=132), config["intermediate_size"], config["prefix_dense_intermediate_size"])
layers = range(5, 45)
def period(d, hop=1.0):
    return timing.timeline(sched, d, hop_us=hop, live_slots=lambda l: 8).layer_period(sched, layers)
base = period(dur)
print(f"default: {base:.1f} us a MoE layer (durations: " + ", ".join(f"{k} {v:.1f}" for k, v in dur.items()) + ")")
print("| wave shortened | to | modelled layer us | change |")
print("|---|---|---|---|")
for wave in ("qkv", "router", "router_topk", "attn_partial", "mlp_up", "attn_combine", "mlp_down", "o_proj", "moe_combine"):
    for f in (0.75, 0.5):
        d = dict(dur); d[wave] = dur[wave] * f
        p = period(d)
        print(f"| {wave} | {f:.0%} ({d[wave]:.1f} us) | {p:.1f} | {(p / base - 1) * 100:+.1f}% |")
for hop in (0.5, 1.5):
    p = period(dur, hop)
    print(f"| every barrier hop | {hop} us (1.0) | {p:.1f} | {(p / base - 1) * 100:+.1f}% |")
# The "top-k in the producers" lead (PERF_LOG's batch-1 section of session M): every MOE_UPGATE task waits on its
# layer's router barrier (the top-k task's own wait) instead of the top-k's signal, each up task longer by the
# producer's own top-k (0 / 0.5 / 1 us).
import dataclasses
from vllm_megakernel.megakernel.schedule import Op
topk = {t.layer: t for t in sched.tasks if t.op == Op.ROUTER_TOPK}
tasks = [dataclasses.replace(t, waits=tuple(topk[t.layer].waits[0] if b == topk[t.layer].signal else b for b in t.waits))
         if t.op == Op.MOE_UPGATE else t for t in sched.tasks]
variant = dataclasses.replace(sched, tasks=tasks)
for extra in (0.0, 0.5, 1.0):
    d = dict(dur); d["mlp_up"] = dur["mlp_up"] + extra
    p = timing.timeline(variant, d, live_slots=lambda l: 8).layer_period(variant, layers)
    print(f"| up/gate waits on the router, not the top-k | +{extra} us an up task | {p:.1f} | {(p / base - 1) * 100:+.1f}% |")

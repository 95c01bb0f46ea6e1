# Session O, CPU: python benchmarks/candidates/signal-delay/predict_cpu.py (checkout root, CPU venv)
# The timing model's prediction for each signal-delay probe: how much a 3 us later signal of one wave moves a
# MoE layer at batch 1 and 8 (megakernel.timing over session O's call 1 cc-2 durations, the schedule main runs;
# the model has no bandwidth: a task takes its wave's traced run time whatever streams beside it). The probes'
# measurements (next session, benchmarks.ab.interleaved) then say where the model is right and, where it is
# not, which waves' completions bandwidth makes critical.
import json
from pathlib import Path

from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel import timing
from vllm_megakernel.megakernel.schedule import StepShape, build_schedule

prof = json.loads(Path("benchmarks/results/h200-2026-12-02-v2-kvcheck-cc/call1/ab/cc-2/profile.json").read_text())
config = prof["config"]
dims = ref.ModelDims.from_config(config)
layers = range(5, 45)
waves = {"router": "ROUTER", "router_topk": "ROUTER_TOPK", "qkv": "QKV_ROPE", "attn_partial": "ATTN_PARTIAL",
         "attn_combine": "ATTN_COMBINE", "mlp_up": "MOE_UPGATE", "mlp_down": "MOE_DOWN", "o_proj": "O_PROJ",
         "moe_combine": "MOE_COMBINE"}
print("| probe (3 us later signals of) | batch 1: modelled layer us | change | batch 8: modelled layer us | change |")
print("|---|---|---|---|---|")
rows = {}
for batch in (1, 8):
    row = [r for r in prof["results"] if r["batch"] == batch][0]
    dur = timing.durations_from_profile(row)
    live = round(row["distinct_experts"])
    sched = build_schedule(dims, StepShape(batch=batch, num_sms=132), config["intermediate_size"],
                           config["prefix_dense_intermediate_size"])

    def period(delay=None):
        return timing.timeline(sched, dur, live_slots=lambda layer: live,
                               signal_delay_us=delay).layer_period(sched, layers)

    base = period()
    rows[batch] = {"base": base, **{w: period({w: 3.0}) for w in waves if w in dur}}
print(f"| none | {rows[1]['base']:.1f} | - | {rows[8]['base']:.1f} | - |")
for w, op in waves.items():
    cells = []
    for batch in (1, 8):
        p = rows[batch].get(w)
        cells.append(f"{p:.1f} | {p - rows[batch]['base']:+.1f} us" if p is not None else "- | -")
    print(f"| {op} | " + " | ".join(cells) + " |")

"""Batch 1's step in megakernel.fluid's model, with the costs of session AR's H200 profile (call 12) and one knob
changed at a time: which part of the step the model says each lever holds. Not a measurement.

    python benchmarks/results/cpu-2026-12-06-session-as-fluid-sensitivity/fluid_sensitivity.py PROFILE_JSON [BATCH]

PROFILE_JSON: benchmarks/results/h200-2026-12-06-session-ar/raw.tar.xz's call12/profile/profile.json."""
import dataclasses
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
from vllm_megakernel import reference as ref  # noqa: E402
from vllm_megakernel.megakernel import fluid, trace  # noqa: E402
from vllm_megakernel.megakernel.schedule import StepShape, build_schedule  # noqa: E402

prof = json.load(open(sys.argv[1]))
b = int(sys.argv[2]) if len(sys.argv) > 2 else 1
config = json.loads((REPO / "configs/north-mini-code/config.json").read_text())
dims = ref.ModelDims.from_config(config)
moe_i, dense_i = config["intermediate_size"], config.get("prefix_dense_intermediate_size") or 0
row = next(r for r in prof["results"] if r["batch"] == b and r.get("schedule", "default") == "default")
print(f"profile row: batch {b}, measured step {row['step_us_median']:.0f} us, layer "
      f"{row.get('timeline', {}).get('next_layer_us', float('nan')):.1f} us")
# today's default schedule for the batch: the profile's tasks only if the defaults have not changed since
sched = build_schedule(dims, StepShape(batch=b, num_sms=132), moe_i, dense_i)
base = fluid.costs_from_profile(row)
nbytes = fluid.task_bytes(sched, [row.get("context", 0) + 1] * b, moe_i, dense_i)
live = min(sched.num_slots, round(row["distinct_experts"]))
middle = trace.middle_moe_layers(dims)
GEMM = {"qkv", "mlp_up", "mlp_down", "o_proj", "attn_partial"}
first = None


def run(name, f=lambda w, c: c, **kw):
    global first
    costs = {w: f(w, c) for w, c in base.items()}
    args = dict(hop_us=0.7, gap_us=0.3)
    args.update(kw)
    t0 = time.time()
    timed = fluid.fluid_timeline(sched, costs, nbytes, live_slots=lambda layer: live, **args)
    step = max(e for e in timed.end if e == e)
    first = first or step
    print(f"| {name} | {step:.0f} | {100 * (step / first - 1):+.1f}% | {timed.layer_period(sched, middle):.1f} |",
          flush=True)


print("| variant | modelled step us | against the first | modelled layer us |\n|---|---|---|---|")
run("as profiled")
run("GEMM waves' inputs phase 0", lambda w, c: dataclasses.replace(c, inputs_us=0.0) if w in GEMM else c)
run("GEMM waves' finish 0", lambda w, c: dataclasses.replace(c, finish_us=0.0) if w in GEMM else c)
run("GEMM waves' inputs and finish halved",
    lambda w, c: dataclasses.replace(c, inputs_us=c.inputs_us / 2, finish_us=c.finish_us / 2) if w in GEMM else c)
run("GEMM waves' inputs and finish 0",
    lambda w, c: dataclasses.replace(c, inputs_us=0.0, finish_us=0.0) if w in GEMM else c)
run("every tail halved", lambda w, c: dataclasses.replace(c, tail_us=c.tail_us / 2))
run("router and top-k free",
    lambda w, c: dataclasses.replace(c, inputs_us=0, stage_work_us=0, finish_us=0, tail_us=0)
    if w in ("router", "router_topk") else c)
run("hop 0", hop_us=0.0)
run("gap 0", gap_us=0.0)
run("consumers' stage pace 0.3 us (0.45)", stage_us=0.3)
run("stages in flight 3 (the default 2)", stages_in_flight=3)
run("stages in flight 5", stages_in_flight=5)
run("HBM's curve x2", bandwidth_scale=2.0)
run("HBM's curve x10", bandwidth_scale=10.0)
run("every fixed cost, hop and gap 0",
    lambda w, c: dataclasses.replace(c, inputs_us=0, finish_us=0, tail_us=0), hop_us=0.0, gap_us=0.0)
# Two consumer groups (benchmarks/candidates/README.md's sketch): the stages stay in task order, so one group of
# four warps at a time consumes them (a slower pace a stage and a tile), while the other group's fixed costs overlap
fixed_gone = lambda w, c: dataclasses.replace(c, inputs_us=0.0, finish_us=0.0) if w in GEMM else c  # noqa: E731
fixed_halved = (lambda w, c: dataclasses.replace(c, inputs_us=c.inputs_us / 2, finish_us=c.finish_us / 2)  # noqa: E731
                if w in GEMM else c)
run("two groups: pace 0.6 us a stage, 1.2 an attention tile, fixed costs overlapped", fixed_gone, stage_us=0.6,
    attention_stage_us=1.2)
run("two groups: pace 0.6 / 1.2 us, half the fixed costs overlapped", fixed_halved, stage_us=0.6,
    attention_stage_us=1.2)
run("two groups: pace 0.9 / 1.8 us, fixed costs overlapped", fixed_gone, stage_us=0.9, attention_stage_us=1.8)

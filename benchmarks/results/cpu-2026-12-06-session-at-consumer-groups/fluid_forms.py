"""Two forms the kernel does not have, in megakernel.fluid's model (its ``groups`` and ``storer_finish``, PERF_LOG
#206), against the kernel's one group of eight consumer warps, with the per-wave costs of a traced profile. Not a
measurement: what the model says each form could give, before either is written. With --per-wave, the kernel's
form with each wave's inputs phase, finish, tail, or all three at 0, one wave at a time: where batch 1's chain of
dependent phases is, wave by wave.

    python benchmarks/results/cpu-2026-12-06-session-at-consumer-groups/fluid_forms.py PROFILE_JSON BATCH [--scale] \
        [--per-wave]

PROFILE_JSON: a kernel_profile profile.json (session AR's H200 call 12, session AS's H100 call 3, both in their
folders' raw.tar.xz); --scale: the HBM curve scaled to the profile's copy bandwidth (an H100's)."""
import dataclasses
import json
import sys
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
GEMM = {"qkv", "mlp_up", "mlp_down", "o_proj", "attn_partial"}


def step(costs, **kw):
    timed = fluid.fluid_timeline(sched, costs, nbytes, live_slots=lambda layer: live, hop_us=0.7, gap_us=0.3,
                                 bandwidth_scale=scale, **kw)
    return max(e for e in timed.end if e == e)


def forms():
    first = None

    def run(name, f=lambda w, c: c, **kw):
        nonlocal first
        s = step({w: f(w, c) for w, c in base.items()}, **kw)
        first = first or s
        print(f"| {name} | {s:.0f} | {100 * (s / first - 1):+.1f}% |", flush=True)

    print("| form | modelled step us | against the first |\n|---|---|---|")
    run("one group of 8 warps (the kernel), stage 0.45 us, attention tile 0.9 us")
    run("two groups, each at 8 warps' pace (0.45 / 0.9 us: a bound, not a form)", groups=2)
    run("two groups of 4 warps at 0.6 / 1.2 us", groups=2, stage_us=0.6, attention_stage_us=1.2)
    run("two groups of 4 warps at 0.9 / 1.8 us", groups=2, stage_us=0.9, attention_stage_us=1.8)
    run("a storer warp, finish as fast as 8 warps'", storer_finish=1.0)
    run("a storer warp, finish 2x 8 warps'", storer_finish=2.0)
    run("session AS's reading of two groups: one group, GEMM waves' inputs and finish 0, 0.6 / 1.2 us",
        lambda w, c: dataclasses.replace(c, inputs_us=0.0, finish_us=0.0) if w in GEMM else c,
        stage_us=0.6, attention_stage_us=1.2)


def per_wave():
    s0 = step(base)
    print(f"modelled step {s0:.0f} us\n\n| wave (inputs / finish / tail us) | inputs 0 | finish 0 | tail 0 | all three 0 |"
          "\n|---|---|---|---|---|")
    for w, c in sorted(base.items()):
        cells = []
        for fields in (("inputs_us",), ("finish_us",), ("tail_us",), ("inputs_us", "finish_us", "tail_us")):
            costs = dict(base)
            costs[w] = dataclasses.replace(c, **{f: 0.0 for f in fields})
            cells.append(f"{100 * (step(costs) / s0 - 1):+.1f}%")
        print(f"| {w} ({c.inputs_us:.1f} / {c.finish_us:.1f} / {c.tail_us:.1f}) | " + " | ".join(cells) + " |",
              flush=True)


per_wave() if "--per-wave" in sys.argv else forms()

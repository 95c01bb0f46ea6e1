"""Kernel A/B in one process: every variant's extension loaded side by side and timed on the very same steps
(the same weights, KV cache, workspace, barriers and tables), in interleaved rounds.

    python -m benchmarks.ab.interleaved --model configs/north-mini-code --batch-sizes 1,8,64 \
        --variant base=variants/base.so --variant fad=variants/fad.so \
        [--variant q32=variants/base.so@qkv_rows=32] [--rounds 6] [--iters 20] [--context 8192] [--out DIR]

Why: batch 1's kernel-alone step has differed between processes running the same kernel by up to 10-13%
(session J's defaults, 2566-2860 us; PERF_LOG #58, #67), more than any change looked for there, so run.sh's
one process per variant cannot decide at batch 1 (session O: both base runs 1.1% apart, all three candidates
6-8% below both, with no wave in their traces moved for a reason). Here the variants share one process and one
set of allocations; each round times every variant ``--iters`` launches (median of the round), in an order
rotated round by round (each variant first as often as the others), and each variant's change is the median over
rounds of its round median against the base's round median of the same round (paired: a slow round moves both).
What still differs between the variants: the kernel's code, and where each extension's code lands.

A variant is an extension and a schedule (a kernel_profile schedule string after `@`, default "default"):
variants of one schedule share one step; a schedule of its own gets its own step (its own workspace and
tables, on the same weights and KV cache), so a schedule against a schedule is paired by rounds but not by
buffers. The extensions must be built for this checkout's ABI (benchmarks/ab/build.sh: the same commit's Python
side). Each variant is checked before any is timed: its extension's ``build_info`` names this ABI and a
decode kernel, and its step output is checked before any is timed (a fast wrong kernel is caught, not timed): a
variant of the base's schedule against the base variant's output (cosine >= 0.999 over the whole batch's hidden
rows; whether it is bit-equal is recorded too); a variant of another schedule against the PyTorch reference step
replaying the variant's own expert choice, no further from it than the base's schedule is (worst row: cosine
at most 0.001 below the base's or >= 0.999, max error at most 1.5x the base's or <= 3% of the row's max, the GPU
step tests' tolerance), since a schedule that sums in another order (another attention split, say) drifts through
the random full-size model's routing near-ties to another output that is just as right (session R: batch 8 at 16
and 17 splits, whole-output cosine 0.32 while both matched the reference on the 5-layer tests; over the full depth
the 17-split step stood at cosine 0.998 and max error 7% from the reference, beyond the 5-layer tolerance, so the
base's own distance sets the bar). The first variant is
the base. After the rounds, one traced launch per variant gives kernel_profile's per-wave report (report.md, a
row per variant; its step time the median of the variant's rounds).

``--control`` adds an A/A row, ``control``: a copy of the base's extension file, loaded as a module of its own
(its code placed anew), on the base's schedule and step. What it shows against the base is this process's noise
for a code change; a variant within it has not shown a change. (A variant naming the base's own file is the base's
module, so it measured round-to-round noise only: session S's "base2".) Between processes batch 1 has moved
more than within one: session T's three runs of one comparison gave -2.77 / -3.32 / -3.94%, each with a range
over rounds narrower than that spread.

``--copies K`` loads every extension file K times, each copy a module of its own (its code placed anew), and times
every copy in every round: a variant's round value is the median over its copies' round medians. Where each module's
code lands moved a build's step by up to ~0.6% against a second module of the same file (the control, PERF_LOG #186,
#188), and a variant's change between two processes by more than a point (#189: -1.62 / -0.22%); a median over
placements is what a change of the code itself should be judged by. Every copy's output must equal its first copy's
bit for bit (the same build on the same step).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
from pathlib import Path

OUTPUT_MIN_COSINE = 0.999


def parse_variants(items: list[str]) -> list[tuple[str, Path, str]]:
    """['base=a.so', 'q32=a.so@qkv_rows=32,attn_splits=64'] -> [('base', Path('a.so'), 'default'),
    ('q32', Path('a.so'), 'qkv_rows=32,attn_splits=64')]; names unique and plain (they name modules), at least
    two variants (the first is the base)."""
    out = []
    for item in (s.strip() for s in items):
        name, sep, rest = item.partition("=")
        path, _, schedule = rest.partition("@")
        if not sep or not name or not path:
            raise ValueError(f"--variant: {item!r} is not NAME=PATH[@SCHEDULE]")
        if not name.isidentifier():
            raise ValueError(f"--variant: {name!r} is not a plain name (letters, digits, _)")
        out.append((name, Path(path), schedule.strip() or "default"))
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"--variant: a name is given twice ({', '.join(names)})")
    if len(out) < 2:
        raise ValueError("--variant: at least two (the first is the base)")
    return out


CONTROL = "control"


def with_control(variants: list[tuple[str, Path, str]], folder: Path) -> list[tuple[str, Path, str]]:
    """``variants`` with an A/A control right after the base: a copy of the base's extension in ``folder`` (a
    file of its own, so it loads as a module of its own) on the base's schedule."""
    if any(name == CONTROL for name, _, _ in variants):
        raise ValueError(f"--control: a variant is already named {CONTROL!r}")
    (base, path, schedule), rest = variants[0], variants[1:]
    copy = folder / f"{CONTROL}{''.join(path.suffixes)}"
    folder.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(path.read_bytes())
    return [(base, path, schedule), (CONTROL, copy, schedule), *rest]


def load_extension(name: str, path: Path, abi_version: int):
    """Loads one variant's extension as its own module (``ab_<name>._C``: the init function a pybind11 module
    exports is named after the last component, so every copy loads; the bindings define functions only, so
    copies do not collide) and checks that it is a decode kernel of this checkout's ABI."""
    if not path.is_file():
        raise FileNotFoundError(f"variant {name}: no extension at {path}")
    spec = importlib.util.spec_from_file_location(f"ab_{name}._C", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from vllm_megakernel.extension import abi_mismatch

    if not module.build_info().get("decode_kernel"):
        raise ValueError(f"variant {name} ({path}): built without the decode kernel")
    if problem := abi_mismatch(module, abi_version):
        raise ValueError(f"variant {name} ({path}): {problem}: build it from this commit (benchmarks/ab/build.sh)")
    return module


def copy_files(path: Path, copies: int, folder: Path) -> list[Path]:
    """``path`` and copies - 1 byte-for-byte copies of it in ``folder`` (each a file of its own, so each loads as a
    module of its own, its code placed anew): the extension files of --copies."""
    folder.mkdir(parents=True, exist_ok=True)
    out = [path]
    for k in range(1, copies):
        copy = folder / f"{path.name.split('.')[0]}-copy{k}{''.join(path.suffixes)}"
        copy.write_bytes(path.read_bytes())
        out.append(copy)
    return out


def round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """Round r times the variants rotated by r: over len(names) rounds each variant holds each place once."""
    n = len(names)
    return [names[r % n:] + names[:r % n] for r in range(rounds)]


def paired_changes(round_medians: dict[str, list[float]], base: str) -> dict[str, dict]:
    """Per variant: its median over rounds (us) and its change against the base, round by round (its round
    median over the base's of the same round, less 1): the median of those and their range. The base's own
    row has changes of 0: its spread over rounds is in ``spread`` (max - min over its median)."""
    ref = round_medians[base]
    out = {}
    for name, times in round_medians.items():
        if len(times) != len(ref):
            raise ValueError(f"{name}: {len(times)} rounds against the base's {len(ref)}")
        changes = [t / b - 1 for t, b in zip(times, ref)]
        med = statistics.median(times)
        out[name] = {"median_us": med, "change": statistics.median(changes), "change_min": min(changes),
                     "change_max": max(changes), "spread": (max(times) - min(times)) / med}
    return out


def table(results: list[dict], base: str) -> str:
    """Markdown: a row per batch and variant: the median step, the paired change against the base (median over
    rounds, and the rounds' range), the variant's own spread over rounds."""
    lines = ["| batch | variant | step us (median of rounds) | change vs " + base + " (median of rounds) | "
             "range over rounds | own spread over rounds | output vs " + base + " |", "|---|---|---|---|---|---|---|"]
    for r in results:
        for name, c in r["variants"].items():
            change = "-" if name == base else f"{100 * c['change']:+.2f}%"
            span = "-" if name == base else f"{100 * c['change_min']:+.2f} .. {100 * c['change_max']:+.2f}%"
            ref_check = r.get("reference_check", {}).get(name)
            out = "-" if name == base else ("bit-equal" if r.get("bit_equal", {}).get(name)
                                           else f"cosine {r.get('output_cosine', {}).get(name, float('nan')):.6f}")
            if ref_check:
                out += (f" (vs reference: cosine >= {ref_check['min_cosine']:.6f}, max err "
                        f"{100 * ref_check['max_rel_err']:.1f}%)")
            lines.append(f"| {r['batch']} | {name} | {c['median_us']:.0f} | {change} | {span} | "
                         f"{100 * c['spread']:.1f}% | {out} |")
    return "\n".join(lines) + "\n"


def reference_distance(dims, weights, inp, schedule, ext) -> dict:
    """One launch of ``schedule`` on a step of its own that logs its expert choice, against the PyTorch reference
    step replaying that choice: the worst live row's cosine and max error relative to the row's max magnitude.
    The reference rewrites the new tokens' K/V slots with its own values (the timed steps only need them finite)."""
    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel import runtime

    step = runtime.build_step(schedule, weights, inp, route_log=True)
    runtime.launch(step, ext=ext)
    runtime.check(step)
    got = step.out.float().clone()
    chosen = runtime.routing_log(step.workspace, dims, schedule.shape.batch).clone()
    del step
    expected = ref.decode_step(dims, weights, inp, forced_experts=chosen).float()
    live = inp.seq_lens.to(got.device) > 0
    cos, err = ref.vector_distance(got[live], expected[live])
    return {"min_cosine": float(cos.min()), "max_rel_err": float(err.max())}


def no_further_from_reference(variant: dict, base: dict) -> bool:
    """A variant's reference distance is acceptable if it is within the GPU step tests' tolerance
    (reference.STEP_MIN_COSINE, STEP_MAX_REL_ERR) or no worse than the base schedule's own distance by more than
    0.001 in cosine and 1.5x in error."""
    from vllm_megakernel.reference import STEP_MAX_REL_ERR, STEP_MIN_COSINE

    return (variant["min_cosine"] >= min(STEP_MIN_COSINE, base["min_cosine"] - 0.001)
            and variant["max_rel_err"] <= max(STEP_MAX_REL_ERR, 1.5 * base["max_rel_err"]))


def time_batch(dims, weights, variants: list[tuple[str, list, str]], batch: int, context: int, rounds: int,
               iters: int, num_sms: int, seed: int) -> dict:
    """variants: (name, its extension modules (the copies of one file; one without --copies), schedule), the base
    first."""
    import torch

    from benchmarks.kernel_profile import gpu_clocks, parse_schedule, random_step_inputs, traced_launch
    from benchmarks.sol import cuda_times
    from vllm_megakernel.megakernel import runtime
    from vllm_megakernel.megakernel.schedule import StepShape, build_schedule

    inp = random_step_inputs(dims, batch, context, seed)
    steps, shapes = {}, {}
    for schedule in dict.fromkeys(s for _, _, s in variants):
        shapes[schedule] = StepShape(batch=batch, num_sms=num_sms, **parse_schedule(schedule))
        steps[schedule] = runtime.build_step(build_schedule(dims, shapes[schedule], *weights.intermediates()),
                                             weights, inp)
    names = [n for n, _, _ in variants]
    runs = {n: (exts, steps[s]) for n, exts, s in variants}
    outputs = {}
    for name, (exts, step) in runs.items():  # every variant checked before any is timed
        for k, ext in enumerate(exts):
            runtime.launch(step, ext=ext)
            runtime.check(step)
            if k == 0:
                outputs[name] = step.out.float().clone()
            elif not torch.equal(step.out.float(), outputs[name]):
                raise AssertionError(f"batch {batch}: variant {name}'s copy {k} (the same build) gave another output "
                                     f"than its first copy")
    cosines, bit_equal, reference = {}, {}, {}
    base_name, (base_ext, *_), base_schedule = variants[0]
    for name, (ext, *_), schedule in variants:
        bit_equal[name] = bool(torch.equal(outputs[name], outputs[names[0]]))
        cos = torch.nn.functional.cosine_similarity(outputs[name].flatten(), outputs[names[0]].flatten(), dim=0)
        cosines[name] = float(cos)
        if schedule != base_schedule:
            if base_name not in reference:
                reference[base_name] = reference_distance(dims, weights, inp, steps[base_schedule].schedule, base_ext)
            reference[name] = reference_distance(dims, weights, inp, steps[schedule].schedule, ext)
            if not no_further_from_reference(reference[name], reference[base_name]):
                raise AssertionError(f"batch {batch}: variant {name} ({schedule}) against the reference replaying its "
                                     f"expert choice: {reference[name]}; the base's schedule: {reference[base_name]}")
        elif not cosines[name] >= OUTPUT_MIN_COSINE:
            raise AssertionError(f"batch {batch}: variant {name}'s step output against {names[0]}'s: cosine "
                                 f"{cosines[name]:.6f} < {OUTPUT_MIN_COSINE}")
    clocks = [gpu_clocks()]
    medians = {name: [] for name in names}
    copy_medians = {name: [] for name in names}  # per round, each copy's median (us)
    orders = round_orders(names, rounds)
    for order in orders:
        for name in order:
            exts, step = runs[name]
            per_copy = []
            for ext in exts:
                times = cuda_times(lambda: runtime.launch(step, ext=ext), iters, warmup=3)
                per_copy.append(statistics.median(times) * 1e6)
            copy_medians[name].append(per_copy)
            medians[name].append(statistics.median(per_copy))
    for _, step in runs.values():
        runtime.check(step)
    clocks.append(gpu_clocks())
    # one traced launch per variant after the timing (its first copy): kernel_profile's per-wave report, a row each
    profiles = []
    for name, (ext, *_), schedule in variants:
        step = runs[name][1]
        profiles.append({"batch": batch, "context": context,
                         "schedule": name + ("" if schedule == "default" else f" ({schedule})"),
                         "attn_splits": shapes[schedule].attn_splits, "tiles": dataclasses.asdict(step.schedule.tiles),
                         "tasks": len(step.schedule.tasks), "step_us_median": statistics.median(medians[name]),
                         "step_us_min": min(medians[name]), "clocks": clocks,
                         **{k: v for k, v in traced_launch(dims, weights, inp, step.schedule, ext).items()
                            if k != "task_trace"}})
    return {"batch": batch, "context": context, "schedules": {n: s for n, _, s in variants}, "rounds": rounds,
            "iters": iters, "orders": orders, "round_medians_us": medians,
            "copies": len(variants[0][1]), "copy_medians_us": copy_medians, "output_cosine": cosines,
            "bit_equal": bit_equal, "reference_check": reference, "clocks": clocks,
            "variants": paired_changes(medians, names[0]), "profiles": profiles}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a config dir (weights are random, made on the GPU)")
    ap.add_argument("--variant", action="append", default=[], help="NAME=PATH[@SCHEDULE]: an extension built by "
                    "ab/build.sh and a kernel_profile schedule (default: default); give it once per variant, the base first")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--control", action="store_true",
                    help="add an A/A row: a copy of the base's extension, loaded as its own module, on its schedule")
    ap.add_argument("--copies", type=int, default=1,
                    help="load every extension this many times (each a module of its own) and take a variant's round "
                         "as the median over its copies")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.iters < 1 or args.copies < 1:
        ap.error("--rounds, --iters and --copies must be at least 1")
    variants = parse_variants(args.variant)
    import tempfile

    if args.control:
        variants = with_control(variants, Path(tempfile.mkdtemp(prefix="ab-control-")))
    from benchmarks.kernel_profile import parse_schedule

    for _, _, schedule in variants:
        parse_schedule(schedule)  # a typo fails before minutes of GPU work

    import torch

    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel import abi

    modules = {}
    copies_at = Path(tempfile.mkdtemp(prefix="ab-copies-")) if args.copies > 1 else None
    for name, path, _ in variants:  # one module per extension file (and copy): variants of one build share them
        key = path.resolve()
        if key not in modules:
            files = copy_files(path, args.copies, copies_at / name) if copies_at else [path]
            modules[key] = [load_extension(name if k == 0 else f"{name}_copy{k}", f, abi.ABI_VERSION)
                            for k, f in enumerate(files)]
    runs = [(name, modules[path.resolve()], schedule) for name, path, schedule in variants]
    from benchmarks.kernel_profile import random_weights, report
    from benchmarks.sol import measure_bandwidth

    config = json.loads((Path(args.model) / "config.json").read_text())
    bandwidth = measure_bandwidth()
    dims = ref.ModelDims.from_config(config)
    weights = random_weights(config, dims, args.seed)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = variants[0][0]
    results = []
    for b in (int(x) for x in args.batch_sizes.split(",")):
        results.append(time_batch(dims, weights, runs, b, args.context, args.rounds, args.iters, num_sms, args.seed))
        text = table(results, base)
        if args.out:  # rewritten after every batch: a run cut by a time limit keeps what it measured
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "table.md").write_text(text)
            (args.out / "report.md").write_text(report([p for r in results for p in r["profiles"]], bandwidth, config))
            (args.out / "results.json").write_text(json.dumps(
                {"variants": {n: {"extension": str(p), "schedule": s} for n, p, s in variants},
                 "bandwidth_bytes_per_s": bandwidth, "results": results}, indent=1))
        torch.cuda.empty_cache()
        print(f"batch {b} done", flush=True)
    print(text)


if __name__ == "__main__":
    main()

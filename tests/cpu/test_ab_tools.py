"""The kernel A/B tools (benchmarks/ab): the variant builder makes an extension of the commit's csrc/ plus
patches, and the table compares each run against the mean of the base's runs."""

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.ab import table as ab_table
from conftest import REPO

CALL2 = REPO / "benchmarks" / "results" / "h200-2026-12-01-v2-topk-abort-release" / "call2"


def test_the_table_puts_each_run_against_the_mean_of_the_base_runs(tmp_path):
    # session E's second call, laid out as run.sh names its runs
    for i, name in enumerate(["base", "T", "TA", "TAR", "base2"], 1):
        (tmp_path / f"{name.rstrip('2')}-{i}").mkdir()
        shutil.copy(CALL2 / name / "profile.json", tmp_path / f"{name.rstrip('2')}-{i}" / "profile.json")
    runs = ["base-1", "T-2", "TA-3", "TAR-4", "base-5"]
    ab_table.main([str(tmp_path)] + runs)
    text = (tmp_path / "ab.md").read_text()
    # the folder's README: base 2711 / 2737 us at batch 1, T 2697 (-1.0%), TAR 8687 us (+2.6%) at batch 8
    row = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "2697 us (-1.0%)" in row["T-2"]
    assert "8687 us (+2.6%)" in row["TAR-4"]
    base = [json.loads((CALL2 / n / "profile.json").read_text()) for n in ("base", "base2")]
    b1 = [ab_table.step_times(p)[1] for p in base]
    assert f"{b1[0]:.0f} us ({(b1[0] / (sum(b1) / 2) - 1) * 100:+.1f}%)" in row["base-1"]
    assert "Changes against the mean of the base runs" in text


def test_a_cell_names_the_lowest_sm_clock_read_around_its_timing(tmp_path):
    """Runs whose profile has clocks (kernel_profile from ba07b5d on) show the lowest SM clock read around
    each batch's timing; runs without them keep their cells as they were."""
    profile = json.loads((CALL2 / "base" / "profile.json").read_text())
    clocked = json.loads(json.dumps(profile))
    for r in clocked["results"]:
        r["clocks"] = [{"sm_mhz": 1980, "reasons": "0x0"}, {"sm_mhz": 1755 if r["batch"] == 1 else 1980,
                                                            "reasons": "0x4"}]
    text = ab_table.table({"base-1": profile, "slow-2": clocked})
    row = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    b1 = ab_table.step_times(profile)[1]
    assert f"| {b1:.0f} us (+0.0%) |" in row["base-1"] and "MHz" not in row["base-1"]
    assert f"{b1:.0f} us (+0.0%) at 1755 MHz" in row["slow-2"] and " at 1980 MHz" in row["slow-2"]


def test_a_run_name_is_its_variant_and_index():
    assert ab_table.variant("base-3") == "base"
    assert ab_table.variant("topk-abort-12") == "topk-abort"
    assert ab_table.variant("base2") == "base2"


def _can_build() -> bool:
    return all(shutil.which(t) for t in ("nvcc", "cmake", "git")) and importlib.util.find_spec("pybind11") is not None


@pytest.mark.skipif(not _can_build(), reason="needs nvcc, cmake, git and pybind11")
def test_the_builder_compiles_the_commit_with_the_variants_patch(tmp_path):
    """One variant, a patch that adds a key to build_info: the extension it writes is that commit's csrc/
    with the patch applied (imported here and asked)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    patch = tmp_path / "marker.patch"
    src = (REPO / "csrc" / "bindings.cpp").read_text()
    anchor = '    info["decode_kernel"] = true;\n'
    assert anchor in src
    lines = src.splitlines(keepends=True)
    at = lines.index(anchor)
    ctx = lines[at - 1:at + 2]
    patch.write_text("--- a/csrc/bindings.cpp\n+++ b/csrc/bindings.cpp\n"
                     f"@@ -{at},3 +{at},4 @@\n" + " " + ctx[0] + " " + ctx[1]
                     + '+    info["ab_variant"] = "marker";\n' + " " + ctx[2])
    out = tmp_path / "variants"
    env = {"PYTHON": sys.executable, "PATH": _path_with(Path(sys.executable).parent),
           "AB_BUILD_DIR": str(tmp_path / "build")}
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "ab" / "build.sh"), str(out), f"marked={patch}"],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=1500)
    assert done.returncode == 0, done.stdout + done.stderr
    spec = importlib.util.spec_from_file_location("_C", out / "marked.so")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    info = module.build_info()
    assert info["ab_variant"] == "marker"
    assert info["decode_kernel"] is True


def _path_with(first: Path) -> str:
    """PATH with ``first`` searched before the rest."""
    return os.pathsep.join([str(first), os.environ.get("PATH", "")])


def test_the_runner_times_each_variant_with_its_own_extension_and_puts_the_checkouts_back(tmp_path):
    """run.sh on a stand-in checkout whose python3 fakes kernel_profile: each run sees the extension of its
    variant in place, runs are named NAME-i in order, the table comes out, and the checkout's own
    extension is back at the end."""
    checkout = tmp_path / "checkout"
    (checkout / "vllm_megakernel").mkdir(parents=True)
    own = checkout / "vllm_megakernel" / "_C.cpython-312-x86_64-linux-gnu.so"
    own.write_text("own")
    variants = tmp_path / "variants"
    variants.mkdir()
    steps = {"base": 1000.0, "fast": 950.0}
    for name in steps:
        (variants / f"{name}.so").write_text(name)
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    # kernel_profile's stand-in: the step time of whichever variant's extension is in place
    fake.write_text(f"""#!/usr/bin/env bash
if [[ $2 == benchmarks.kernel_profile ]]; then
  while [[ $# -gt 0 ]]; do [[ $1 == --out ]] && out=$2; shift; done
  mkdir -p "$out"; variant=$(cat vllm_megakernel/_C.cpython-312-x86_64-linux-gnu.so)
  step=$( [[ $variant == base ]] && echo {steps['base']} || echo {steps['fast']} )
  echo '{{"bandwidth_bytes_per_s": 4.2e12, "results": [{{"batch": 1, "schedule": "default", "step_us_median": '$step'}}]}}' > "$out/profile.json"
  echo "$variant" > "$out/seen"
else
  PYTHONPATH={REPO} exec {sys.executable} "$@"
fi
""")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=_path_with(fake.parent))
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "ab" / "run.sh"), str(variants), "out", "1",
                           "base", "fast", "base"], cwd=checkout, capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = checkout / "out"
    assert [(out / r / "seen").read_text().strip() for r in ("base-1", "fast-2", "base-3")] == ["base", "fast", "base"]
    assert own.read_text() == "own"
    assert "| fast-2 | 4.20 | 950 us (-5.0%) |" in (out / "ab.md").read_text()
    assert "| fast-2 | 4.20 | 950 us (-5.0%) |" in done.stdout


# benchmarks/ab/interleaved.py: the in-process A/B (its GPU path runs on the device host)

from benchmarks.ab import interleaved


def test_variants_parse_as_named_extensions_with_a_schedule_each_the_first_the_base():
    got = interleaved.parse_variants(["base=variants/base.so", " fad=variants/fad.so ",
                                      "q32=variants/base.so@qkv_rows=32,attn_splits=64"])
    assert got == [("base", Path("variants/base.so"), "default"), ("fad", Path("variants/fad.so"), "default"),
                   ("q32", Path("variants/base.so"), "qkv_rows=32,attn_splits=64")]
    for bad, says in [(["base=a.so"], "at least two"), (["base=a.so", "base=b.so"], "twice"),
                      (["base", "fad=b.so"], "NAME=PATH"), (["base=a.so", "f-d=b.so"], "plain name"),
                      (["base=a.so", "x=@qkv_rows=32"], "NAME=PATH")]:
        with pytest.raises(ValueError, match=says):
            interleaved.parse_variants(bad)


def test_rotated_rounds_give_every_variant_every_place_once():
    names = ["base", "a", "b"]
    orders = interleaved.round_orders(names, 6)
    assert all(sorted(o) == sorted(names) for o in orders)
    for place in range(3):
        firsts = [o[place] for o in orders[:3]]
        assert sorted(firsts) == sorted(names)
    assert orders[3:] == orders[:3]


def test_changes_are_paired_round_by_round_so_a_slow_round_moves_both_sides():
    # the rounds drift by 20% (a slow process state, a clock step); the variant is 1% faster in each round
    base = [100.0, 110.0, 120.0, 105.0]
    got = interleaved.paired_changes({"base": base, "v": [t * 0.99 for t in base]}, "base")
    assert got["v"]["change"] == pytest.approx(-0.01)
    assert got["v"]["change_min"] == pytest.approx(-0.01) and got["v"]["change_max"] == pytest.approx(-0.01)
    # the drift shows in the base's own spread over rounds, not in the paired change
    assert got["base"]["spread"] == pytest.approx(20 / statistics.median(base))
    assert got["base"]["change"] == 0
    with pytest.raises(ValueError, match="rounds"):
        interleaved.paired_changes({"base": base, "v": base[:2]}, "base")
    text = interleaved.table([{"batch": 1, "variants": got, "bit_equal": {"v": False},
                               "output_cosine": {"v": 0.9999876}}], "base")
    assert "| 1 | v | 106 | -1.00% | -1.00 .. -1.00% | 18.6% | cosine 0.999988 |" in text
    assert "| 1 | base | 108 | - | - | 18.6% | - |" in text
    # a variant of another schedule is checked against the reference, and the table says so
    text = interleaved.table([{"batch": 8, "variants": got, "bit_equal": {"v": False}, "output_cosine": {"v": 0.32},
                               "reference_check": {"v": {"min_cosine": 0.99989, "max_rel_err": 0.016}}}], "base")
    assert ("| 8 | v | 106 | -1.00% | -1.00 .. -1.00% | 18.6% | cosine 0.320000 (vs reference: cosine >= 0.999890, "
            "max err 1.6%) |") in text
    # the bar is the test tolerance or the base schedule's own distance from the reference, whichever is looser
    deep = {"min_cosine": 0.9982, "max_rel_err": 0.070}
    assert interleaved.no_further_from_reference({"min_cosine": 0.9981, "max_rel_err": 0.075}, deep)
    assert interleaved.no_further_from_reference({"min_cosine": 0.9991, "max_rel_err": 0.02},
                                                 {"min_cosine": 0.9999, "max_rel_err": 0.001})
    assert not interleaved.no_further_from_reference({"min_cosine": 0.990, "max_rel_err": 0.07}, deep)
    assert not interleaved.no_further_from_reference({"min_cosine": 0.9985, "max_rel_err": 0.2}, deep)


def test_an_extension_of_another_abi_or_without_the_decode_kernel_is_refused(tmp_path):
    """load_extension's checks, on stand-in modules (a build's own .so loads only on the GPU host's Python)."""
    for name, info, says in [("old", {"decode_kernel": True, "abi_version": 10}, "ABI 10"),
                             ("nodecode", {"decode_kernel": False, "abi_version": 11}, "without the decode kernel")]:
        path = tmp_path / f"{name}.py"
        path.write_text(f"def build_info():\n    return {info!r}\n")
        with pytest.raises(ValueError, match=says):
            interleaved.load_extension(name, path, 11)
    ok = tmp_path / "ok.py"
    ok.write_text("def build_info():\n    return {'decode_kernel': True, 'abi_version': 11}\n")
    assert interleaved.load_extension("ok", ok, 11).build_info()["abi_version"] == 11
    with pytest.raises(FileNotFoundError, match="no extension"):
        interleaved.load_extension("missing", tmp_path / "missing.so", 11)


def test_the_control_is_a_copy_of_the_base_extension_on_the_base_schedule(tmp_path):
    """--control's A/A row: the base's file copied (a path of its own loads as a module of its own), on the base's
    schedule, right after the base; a variant already named control is refused."""
    base = tmp_path / "base.cpython-312-x86_64-linux-gnu.so"
    base.write_bytes(b"\x7fELF the base build")
    variants = interleaved.parse_variants([f"base={base}@qkv_rows=32", "fast=f.so"])
    got = interleaved.with_control(variants, tmp_path / "ctl")
    assert [(n, s) for n, _, s in got] == [("base", "qkv_rows=32"), ("control", "qkv_rows=32"), ("fast", "default")]
    copy = got[1][1]
    assert copy.read_bytes() == base.read_bytes() and copy.resolve() != base.resolve()
    assert copy.name == "control.cpython-312-x86_64-linux-gnu.so"
    with pytest.raises(ValueError, match="already named 'control'"):
        interleaved.with_control(interleaved.parse_variants([f"base={base}", "control=f.so"]), tmp_path / "x")


def test_interleaved_main_times_every_variant_on_its_schedules_step_and_writes_the_table(tmp_path, monkeypatch):
    """main()'s wiring on the CPU, its GPU pieces stood in for: variants of one schedule run one step, a schedule
    of its own gets its own; every variant is launched (and traced) with its own extension; the table, the
    per-wave report and results.json carry every batch and variant; a variant whose output differs from the
    base's is refused before timing."""
    import types

    import torch

    from benchmarks import kernel_profile, sol
    from conftest import FULL_CONFIG
    from vllm_megakernel import reference as ref
    from vllm_megakernel.megakernel import runtime

    exts = {}

    def fake_load(name, path, abi_version):
        exts[name] = types.SimpleNamespace(name=name, path=path)
        return exts[name]

    built, launched = [], []

    def fake_build_step(sched, weights, inp, route_log=False):
        built.append(sched)
        return types.SimpleNamespace(schedule=sched, out=None)

    # the kernel's output: the same for every extension unless it is named "wrong"; a step time per extension
    def fake_launch(step, ext=None):
        launched.append((ext.name, step.schedule.tiles.qkv_rows))
        odd = ext.name in ("wrong", "odd_copy1")
        step.out = torch.full((2, 4), 2.0 if odd else 1.0) + torch.arange(4.0)
        step.out[0, 0] = -1.0 if odd else 1.0

    monkeypatch.setattr(interleaved, "load_extension", fake_load)
    monkeypatch.setattr(runtime, "build_step", fake_build_step)
    monkeypatch.setattr(runtime, "launch", fake_launch)
    monkeypatch.setattr(runtime, "check", lambda step: None)
    monkeypatch.setattr(kernel_profile, "random_step_inputs", lambda dims, b, ctx, seed: object())
    monkeypatch.setattr(kernel_profile, "gpu_clocks", lambda: None)
    traced = []

    def fake_traced_launch(dims, weights, inp, sched, ext=None):
        traced.append((ext.name, sched.tiles.qkv_rows))
        return {"traced_step_us": 1.0, "distinct_experts": 8.0, "waves": [], "task_trace": None}

    monkeypatch.setattr(kernel_profile, "traced_launch", fake_traced_launch)
    checked = []

    def fake_reference_distance(dims, weights, inp, sched, ext):
        checked.append((ext.name, sched.tiles.qkv_rows))
        return {"min_cosine": 0.9982 if ext.name == "bad" else 0.99989, "max_rel_err": 0.2 if ext.name == "bad" else 0.016}

    monkeypatch.setattr(interleaved, "reference_distance", fake_reference_distance)
    monkeypatch.setattr(sol, "measure_bandwidth", lambda: 4.0e12)
    step_us = {"base": 100e-6, "fast": 99e-6, "q32": 101e-6, "wrong": 100e-6, "control": 100e-6}
    monkeypatch.setattr(sol, "cuda_times", lambda fn, iters, warmup=2: (fn(), [step_us[launched[-1][0]]] * iters)[1])
    monkeypatch.setattr(ref.Weights, "random", classmethod(lambda cls, *a, **k: types.SimpleNamespace(
        intermediates=lambda: (768, 12288))))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    # q32 names base's file: one extension, two schedules
    interleaved.main(["--model", str(FULL_CONFIG), "--batch-sizes", "1,8", "--rounds", "3", "--iters", "2",
                      "--variant", "base=b.so", "--variant", "fast=f.so", "--variant", "q32=b.so@qkv_rows=32",
                      "--out", str(tmp_path)])
    assert sorted(exts) == ["base", "fast"]  # q32 shares base's module
    assert [s.tiles.qkv_rows for s in built] == [64, 32, 40, 32]  # per batch: the default's step, then q32's
    rows = {name: {r for n, r in launched if n == name} for name in exts}
    assert rows == {"base": {64, 40, 32}, "fast": {64, 40}}  # fast on the default's steps; q32 = base's module
    text = (tmp_path / "table.md").read_text()
    assert "| 1 | fast | 99 | -1.00% |" in text and "| 8 | fast | 99 | -1.00% |" in text
    assert "| 8 | q32 | 100 | +0.00% |" in text
    assert traced == [("base", 64), ("fast", 64), ("base", 32), ("base", 40), ("fast", 40), ("base", 32)]
    rep = (tmp_path / "report.md").read_text()  # kernel_profile's report, a row per variant and batch
    assert "HBM copy bandwidth measured in this run: 4.00 TB/s" in rep
    assert "| 8 | 8192 | q32 (qkv_rows=32) | 16 |" in rep and "| 1 | 8192 | fast | 128 |" in rep
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["variants"]["q32"] == {"extension": "b.so", "schedule": "qkv_rows=32"}
    assert [r["orders"] for r in res["results"]][0] == [["base", "fast", "q32"], ["fast", "q32", "base"],
                                                        ["q32", "base", "fast"]]
    # a variant of another schedule is checked against the reference, not against the base's output
    assert checked == [("base", 64), ("base", 32), ("base", 40), ("base", 32)]  # per batch: base's schedule, q32's
    assert "| 8 | q32 | 100 | +0.00% |" in text and "vs reference: cosine >= 0.999890, max err 1.6%" in text
    # --control: the base's file copied and loaded as its own module, timed on the base's step
    exts.clear()
    (tmp_path / "b.so").write_bytes(b"base build")
    interleaved.main(["--model", str(FULL_CONFIG), "--batch-sizes", "1", "--rounds", "2", "--iters", "1",
                      "--variant", f"base={tmp_path / 'b.so'}", "--variant", "fast=f.so", "--control"])
    assert sorted(exts) == ["base", "control", "fast"] and exts["control"].path != exts["base"].path
    # --copies: every extension file loaded twice (the second a file of its own), every copy timed in every round, a
    # variant's round the median over its copies; a copy whose output differs from its first copy's is refused
    exts.clear()
    step_us.update({"base_copy1": 100e-6, "fast_copy1": 97e-6})
    for name in ("f", "o"):
        (tmp_path / f"{name}.so").write_bytes(f"{name} build".encode())
    interleaved.main(["--model", str(FULL_CONFIG), "--batch-sizes", "1", "--rounds", "2", "--iters", "1",
                      "--variant", f"base={tmp_path / 'b.so'}", "--variant", f"fast={tmp_path / 'f.so'}",
                      "--copies", "2", "--out", str(tmp_path / "copies")])
    assert sorted(exts) == ["base", "base_copy1", "fast", "fast_copy1"]
    assert exts["fast_copy1"].path != exts["fast"].path and exts["fast_copy1"].path.read_bytes() == b"f build"
    assert "| 1 | fast | 98 | -2.00% |" in (tmp_path / "copies" / "table.md").read_text()
    res = json.loads((tmp_path / "copies" / "results.json").read_text())["results"][0]
    assert res["copies"] == 2 and res["copy_medians_us"]["fast"] == [[99.0, 97.0]] * 2
    with pytest.raises(AssertionError, match="odd's copy 1"):
        interleaved.main(["--model", str(FULL_CONFIG), "--batch-sizes", "1", "--variant", f"base={tmp_path / 'b.so'}",
                          "--variant", f"odd={tmp_path / 'o.so'}", "--copies", "2"])
    with pytest.raises(AssertionError, match="wrong's step output"):
        interleaved.main(["--model", str(FULL_CONFIG), "--batch-sizes", "1", "--variant", "base=b.so",
                          "--variant", "wrong=w.so"])
    # another schedule whose output differs from the base's passes if the reference agrees, fails if not
    checked.clear()
    interleaved.main(["--model", str(FULL_CONFIG), "--batch-sizes", "1", "--rounds", "1", "--iters", "1",
                      "--variant", "base=b.so", "--variant", "wrong=w.so@qkv_rows=32"])
    assert checked == [("base", 64), ("wrong", 32)]
    with pytest.raises(AssertionError, match="variant bad .* against the reference"):
        interleaved.main(["--model", str(FULL_CONFIG), "--batch-sizes", "1", "--variant", "base=b.so",
                          "--variant", "bad=w.so@qkv_rows=32"])


def test_processes_table_shows_each_process_level_routing_and_blocks_moved(tmp_path):
    """benchmarks.ab.processes: per process (a kernel_profile folder) the batch-1 step, layer, routing chain and
    routing's physical SMs, and how many blocks sit on another physical SM than in the first process; a
    profile from before ABI 12 (no physical SMs) is refused by name."""
    from benchmarks.ab import processes

    def profile(step, router, smids):
        waves = [{"wave": "router", "run_us": router, "inputs_us": router / 2},
                 {"wave": "router_topk", "run_us": 3.7, "inputs_us": 2.5}]
        timeline = {"next_layer_us": step / 50, "waves": [{"wave": "mlp_up", "first_run_us": 11.5}]}
        row = {"batch": 1, "schedule": "default", "step_us_median": step, "waves": waves, "timeline": timeline,
               "physical_sms": smids, "routing_physical_sms": {"layer": 2, "router": smids[:2], "router_topk": [smids[2]]}}
        return {"results": [row, {**row, "batch": 8}]}

    for name, step, router, smids in [("p1", 2515, 4.4, [0, 1, 2, 3]), ("p2", 2775, 7.1, [2, 3, 0, 1]),
                                      ("p3", 2516, 4.5, [0, 1, 2, 3])]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "profile.json").write_text(json.dumps(profile(step, router, smids)))
    rows = [processes.process_row(n, json.loads((tmp_path / n / "profile.json").read_text())) for n in ("p1", "p2", "p3")]
    lines = processes.table(rows).splitlines()
    assert lines[2] == "| p1 | 2515 | 50.3 | 4.4 (2.2) | 3.7 | 11.5 | router [0, 1]; router_topk [2] | 0 |"
    assert lines[3].startswith("| p2 | 2775 | 55.5 | 7.1 (3.5) |") and lines[3].endswith("| router [2, 3]; router_topk [0] | 4 |")
    assert lines[4].endswith("| 0 |")
    old = profile(2515, 4.4, [0, 1, 2, 3])
    del old["results"][0]["physical_sms"]
    with pytest.raises(ValueError, match="old: no physical SMs"):
        processes.process_row("old", old)


def test_processes_reads_an_interleaved_folder_as_a_row_per_variant(tmp_path):
    from benchmarks.ab import processes

    def prof(name, step, smids):
        return {"schedule": name, "batch": 1, "step_us_median": step,
                "waves": [{"wave": "router", "run_us": 4.4, "inputs_us": 2.2},
                          {"wave": "router_topk", "run_us": 3.7, "inputs_us": 2.5}],
                "timeline": {"next_layer_us": 48.6, "waves": [{"wave": "mlp_up", "first_run_us": 11.5}]},
                "physical_sms": smids, "routing_physical_sms": {"layer": 2, "router": smids[:1], "router_topk": smids[1:2]}}

    (tmp_path / "i1").mkdir()
    (tmp_path / "i1" / "results.json").write_text(json.dumps({"results": [
        {"batch": 1, "profiles": [prof("base", 2775, [3, 2, 1, 0]), prof("smid", 2515, [0, 1, 2, 3])]},
        {"batch": 8, "profiles": [prof("base", 7900, [3, 2, 1, 0])]}]}))
    rows = processes.process_rows("i1", tmp_path / "i1")
    assert [(r["name"], r["step_us"], r["physical_sms"]) for r in rows] == [
        ("i1/base", 2775, [3, 2, 1, 0]), ("i1/smid", 2515, [0, 1, 2, 3])]
    assert processes.table(rows).splitlines()[3].endswith("| 4 |")  # smid's map against base's: all 4 moved
    with pytest.raises(ValueError, match="no batch 2"):
        processes.process_rows("i1", tmp_path / "i1", batch=2)


from benchmarks.ab import pick as ab_pick


def _run_folder(folder: Path, changes: dict[str, tuple[float, float]]) -> Path:
    """An ab.interleaved --out folder whose one batch has these (median change, fastest round's change) per
    variant, as fractions (the base's row at 0)."""
    variants = {"base": {"median_us": 1000.0, "change": 0.0, "change_min": 0.0, "change_max": 0.0, "spread": 0.01}}
    for name, (change, fastest) in changes.items():
        variants[name] = {"median_us": 1000.0 * (1 + change), "change": change, "change_min": fastest,
                          "change_max": change + 0.01, "spread": 0.01}
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"variants": {}, "results": [{"batch": 1, "variants": variants}]}))
    return folder


def test_the_pick_is_the_fastest_candidate_that_beats_the_control_and_keeps_the_guard_batch(tmp_path, capsys):
    """A candidate is taken on only when at the primary batch it is at least the required gain faster and faster
    than the A/A control's fastest round, and at the guard batch at most the allowed loss slower; of those, the
    fastest at the primary batch. Nothing is picked when no candidate qualifies or a run left no results."""
    b1 = _run_folder(tmp_path / "b1", {"control": (-0.006, -0.014), "a": (-0.030, -0.040), "b": (-0.050, -0.060),
                                       "c": (-0.012, -0.020), "d": (-0.005, -0.010)})
    b8 = _run_folder(tmp_path / "b8", {"control": (0.0, -0.002), "a": (0.004, 0.0), "b": (0.009, 0.0),
                                       "c": (-0.010, -0.02), "d": (-0.010, -0.02)})
    p1, p8 = ab_pick.changes(b1), ab_pick.changes(b8)
    # b is fastest at batch 1 but 0.9% slower at batch 8; c beats 1% but not the control's -1.4%; d gains too little
    assert ab_pick.pick(p1, p8, ["a", "b", "c", "d"]) == "a"
    assert ab_pick.pick(p1, p8, ["a", "b", "c", "d"], guard_loss=1.0) == "b"
    assert ab_pick.pick(p1, p8, ["c", "d"]) is None
    assert ab_pick.pick(p1, p8, ["c"], gain=1.0) is None and ab_pick.pick(p1, {}, ["a"]) is None
    assert ab_pick.changes(tmp_path / "missing") == {}
    ab_pick.main([str(b1), str(b8), "a", "b", "c"])
    assert capsys.readouterr().out == "a\n"
    ab_pick.main([str(b1), str(tmp_path / "cut-short"), "a", "b"])
    assert capsys.readouterr().out == "\n"


def test_the_pick_on_session_zs_committed_ab_is_the_variant_that_call_picked_and_landed():
    """Session Z's call 1 picked pcorel with the same rule (then a regular expression over its table.md)."""
    z = REPO / "benchmarks/results/h200-2026-12-04-v2-session-z/call1"
    assert ab_pick.pick(ab_pick.changes(z / "b1"), ab_pick.changes(z / "b8"), ["pco", "pcons", "pcorel"]) == "pcorel"

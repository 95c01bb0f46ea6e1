"""Harness arithmetic and rendering, from the config and a recorded result (no GPU)."""

import argparse
import copy
import json
import random
import re
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import FULL_CONFIG, REPO, committed_results, result_id
from benchmarks import report
from benchmarks.kv_fit import (KVGroup, blocks_needed, case_blocks_needed, kv_groups, layer_specs,
                               mark_cases_that_do_not_fit, usable_blocks)
from benchmarks.sol import ModelBytes, expected_distinct_experts, sol_tokens_per_s


@pytest.fixture(scope="module")
def config():
    return json.loads((FULL_CONFIG / "config.json").read_text())


def test_bytes_per_step_match_the_design_figures(config):
    """DESIGN.md section 6: 6.61 GB of weights + 0.52 GB of KV at batch 1, 8K -> ~600 tok/s at 4.28 TB/s."""
    mb = ModelBytes.from_config(config)
    assert mb.step_bytes([], 8) == pytest.approx(6.61e9, rel=2e-3)
    assert mb.kv_bytes(8192) == pytest.approx(0.52e9, rel=2e-3)
    assert sol_tokens_per_s(mb, 1, 8192, 4.28e12) == pytest.approx(600, rel=5e-3)


def test_kv_bytes_stop_growing_on_sliding_layers_past_the_window(config):
    mb = ModelBytes.from_config(config)
    grow_below = mb.kv_bytes(4096) - mb.kv_bytes(4095)
    grow_above = mb.kv_bytes(10000) - mb.kv_bytes(9999)
    assert grow_below == mb.kv_per_token_full + mb.kv_per_token_sliding
    assert grow_above == mb.kv_per_token_full  # only the 13 full-attention layers keep growing


def test_expected_distinct_experts_formula_against_sampling():
    assert expected_distinct_experts(128, 8, 1) == pytest.approx(8)
    assert expected_distinct_experts(128, 8, 0) == 0
    rng = random.Random(0)
    for batch in (2, 8, 64):
        trials = [len({e for _ in range(batch) for e in rng.sample(range(128), 8)}) for _ in range(4000)]
        assert expected_distinct_experts(128, 8, batch) == pytest.approx(sum(trials) / len(trials), rel=0.01)
    assert expected_distinct_experts(128, 8, 1000) == pytest.approx(128, rel=1e-3)
    # vLLM's uniform routing simulator: torch.randint, repeats allowed within a token
    from benchmarks.sol import expected_distinct_experts_with_replacement

    for batch in (1, 8):
        trials = [len({rng.randrange(128) for _ in range(8 * batch)}) for _ in range(4000)]
        assert expected_distinct_experts_with_replacement(128, 8, batch) == pytest.approx(sum(trials) / len(trials),
                                                                                            rel=0.01)


@pytest.mark.parametrize("blocks, max_model_len, logged", [(168162, 33040, 28.46), (168443, 262144, 8.33),
                                                              (168162, 8464, 79.36)])
def test_kv_groups_are_vllms_own_and_give_the_concurrency_the_h200_engines_logged(config, blocks, max_model_len,
                                                                                 logged):
    """The layer specs built from the config, grouped by vLLM's own function, give back the "Maximum
    concurrency" each H200 engine logged for its block count and max_model_len (the 32K, 256K and 8K runs
    of benchmarks/results/h200-2026-11-30-stock-grid, LLM's default 16384 batched tokens). So the groups
    kv_fit counts with are the ones the engine had."""
    import types

    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups, get_max_concurrency_for_kv_cache_config
    from vllm.v1.kv_cache_interface import KVCacheConfig

    stub = types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=16384),
        model_config=types.SimpleNamespace(max_model_len=max_model_len),
        parallel_config=types.SimpleNamespace(decode_context_parallel_size=1, prefill_context_parallel_size=1),
        cache_config=types.SimpleNamespace())
    groups = get_kv_cache_groups(stub, layer_specs(config))
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    assert get_max_concurrency_for_kv_cache_config(stub, kv) == pytest.approx(logged, abs=0.005)
    assert kv_groups(config) == [KVGroup(None, 16)] + [KVGroup(config["sliding_window"], 16)] * 3


H200_BATCHED = 16384  # LLM's max_num_batched_tokens in every H200 engine log of these runs


def test_a_batch_fits_the_kv_cache_only_if_every_group_holds_its_blocks(config):
    """On the H200 the old check (blocks x 16 tokens >= B x length) let 64 sequences of 32K through: 2.1 M
    of 2.69 M "tokens". Counted per group, 58 of them fit the 168,162-block pool (less the null block) at
    once, so vLLM could not run the batch of 64 together and the case measured no batch-64 rate."""
    groups = kv_groups(config)
    pool = usable_blocks(168162)
    decode_32k = 2064 + 3 * 257  # full group: every token; each sliding group: its window's 256 blocks + 1
    admit_surplus = 3 * (1281 - 257)  # the last one admitted: each sliding group at vLLM's admission cap
    assert blocks_needed(groups, 1, 32768 + 256, H200_BATCHED) == decode_32k + admit_surplus
    assert blocks_needed(groups, 58, 32768 + 256, H200_BATCHED) <= pool < blocks_needed(groups, 59, 32768 + 256,
                                                                                         H200_BATCHED)
    assert blocks_needed(groups, 32, 32768 + 256, H200_BATCHED) <= pool  # batch 32 at 32K fits
    assert blocks_needed(groups, 16, 131072 + 256, H200_BATCHED) <= pool  # batch 16 at 128K fits
    assert blocks_needed(groups, 8, 261872 + 256, H200_BATCHED) <= usable_blocks(168443)  # 256K's engine
    assert blocks_needed(groups, 16, 261872 + 256, H200_BATCHED) > usable_blocks(168443)
    # short sequences: a sliding group holds no more than the sequence, in decode or at admission
    assert blocks_needed(groups, 2, 1000, H200_BATCHED) == 2 * 4 * 63
    # no sliding layers: the old tokens-per-block arithmetic, exactly
    full = [KVGroup(None, 16)]
    assert blocks_needed(full, 8, 2001, H200_BATCHED) == 8 * 126 and blocks_needed(full, 8, 2000, H200_BATCHED) == 1000


def test_with_the_hybrid_kv_manager_off_every_layer_keeps_every_token(config):
    """vLLM then merges all layers into one full-attention group that still carries the window; counting
    that window would undercount eightfold."""
    import types

    off = types.SimpleNamespace(scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=True))
    groups = kv_groups(config, vllm_config=off)
    assert groups == [KVGroup(None, 16)]
    assert blocks_needed(groups, 64, 32768 + 256, H200_BATCHED) == 64 * 2064


def recorded(config, megakernel_ran=True):
    cases = []
    for side, per_req in (("stock", 200.0), ("megakernel", 300.0)):
        for batch in (1, 8):
            for ctx in (1024, 8192):
                cases.append({"side": side, "batch": batch, "context": ctx, "status": "ok",
                              "per_request_tok_s": [per_req * 0.98, per_req, per_req * 1.01]})
    cases.append({"side": "stock", "batch": 64, "context": 131072, "status": "skipped", "reason": "KV too small"})
    decision = "vllm_megakernel: decode runs on the megakernel" if megakernel_ran else \
        "vllm_megakernel: decode runs on stock vLLM: LoRA is on"
    return {"env": {"gpu": "H200", "vllm": "0.24.0", "torch": "2.11.0", "repeats": 3},
            "bandwidth_bytes_per_s": 4.28e12, "new_tokens": 1000, "config": config,
            "sides": {"stock": {"use_megakernel": False, "decision": "off"},
                      "megakernel": {"use_megakernel": megakernel_ran, "decision": decision}},
            "cases": cases}


def test_summary_medians_ratios_and_sol(config):
    rows = report.summarize(recorded(config))
    row = next(r for r in rows if r["batch"] == 8 and r["context"] == 8192)
    assert row["stock"] == pytest.approx(8 * 200) and row["megakernel"] == pytest.approx(8 * 300)
    assert row["stock_spread"] == pytest.approx((8 * 196, 8 * 202))
    assert row["ratio"] == pytest.approx(1.5)
    assert row["distinct_source"] == "uniform"
    assert row["megakernel_pct_sol"] == pytest.approx(100 * 2400 / row["sol_tok_s"])
    skipped = next(r for r in rows if r["batch"] == 64)
    assert skipped["stock"] is None and "KV too small" in skipped["stock_note"]


def test_table_says_plainly_when_the_megakernel_side_fell_back(config):
    ran = report.markdown(recorded(config, megakernel_ran=True))
    fell_back = report.markdown(recorded(config, megakernel_ran=False))
    assert "ran stock vLLM" not in ran and "| 8 | 8K | 1600 (1568-1616) | 2400 (2352-2424) | 1.50x |" in ran
    assert fell_back.startswith("**The megakernel side ran stock vLLM** (vllm_megakernel: decode runs on stock")


def test_table_gives_each_sides_engine_start_up_when_the_run_recorded_it(config):
    result = recorded(config)
    assert "Engine start-up" not in report.markdown(result)  # runs before decode_sweep recorded it
    for c in result["cases"]:
        if c["status"] == "ok":
            c["engine_init_s"] = 50.2 if c["side"] == "stock" else 124.7
    assert "Engine start-up (LLM() to ready: weights, torch.compile, CUDA graphs): stock 50 s; megakernel 125 s." \
        in report.markdown(result)


def test_table_says_the_megakernel_side_has_no_numbers_when_its_engine_stopped_before_any_case(config, tmp_path):
    """A sweep cut off by its time limit while the megakernel engine was still warming up: collect_side
    records that engine as stopped (use_megakernel False) and every case as failed, which is not a fallback."""
    from benchmarks import decode_sweep

    result = recorded(config)
    mk_cases = [{"batch": c["batch"], "context": c["context"]}
                for c in result["cases"] if c["side"] == "megakernel"]
    result["cases"] = [c for c in result["cases"] if c["side"] != "megakernel"]
    part = tmp_path / "megakernel.json"  # never written: the worker was stopped first
    got, decision = decode_sweep.collect_side("megakernel", mk_cases, part, "stopped by SIGTERM")
    result["cases"] += got
    result["sides"]["megakernel"] = decision
    table = report.markdown(result)
    assert table.startswith("**The megakernel side has no numbers** (the megakernel engine stopped (stopped by "
                            "SIGTERM) before this case")
    assert "ran stock vLLM" not in table and "second stock measurement" not in table
    assert "| 8 | 8K | 1600 (1568-1616) | - (the megakernel engine stopped (stopped by SIGTERM)" in table


def test_a_rate_above_the_speed_of_light_is_flagged_as_invalid(config):
    """A side that ran faster than its bytes allow skipped work or was timed wrong (a sweep's rows that drew
    the same experts; a run cut short): the table says so under the row instead of letting it pass."""
    result = recorded(config)
    sol = {(r["batch"], r["context"]): r["sol_tok_s"] for r in report.summarize(result)}

    def at(share):  # per-request rates at this share of the row's speed of light
        return lambda c: [share * sol[c["batch"], c["context"]] / c["batch"]] * 3

    for c in result["cases"]:
        if c["status"] == "ok":
            c["per_request_tok_s"] = at(0.5)(c)
    assert "Above the speed of light" not in report.markdown(result)
    for c in result["cases"]:
        if c["side"] == "megakernel" and c["batch"] == 8 and c["context"] == 8192:
            c["per_request_tok_s"] = at(1.5)(c)
    table = report.markdown(result)
    assert "**Above the speed of light, not a valid figure:** megakernel at batch 8, 8K ran at 150%" in table
    assert "stock at batch 8" not in table


def test_the_sol_counts_the_experts_the_megakernels_own_steps_routed_where_the_run_read_them(config):
    """A long history can route a batch's rows to fewer distinct experts than the routing probe's short one: the
    megakernel side reads its last step's count (run_distinct_experts), and the speed of light of both sides uses
    it, the table marking the count "(run)" and naming the probe's figure beside it."""
    result = recorded(config)
    for c in result["cases"]:
        if c["batch"] == 8 and c["context"] == 8192:
            c["distinct_experts"] = 51.4 if c["side"] == "stock" else None
            if c["side"] == "megakernel":
                c["run_distinct_experts"] = 40.0
    rows = {(r["batch"], r["context"]): r for r in report.summarize(result)}
    row, other = rows[8, 8192], rows[8, 1024]
    mb = ModelBytes.from_config(config)
    assert row["distinct_source"] == "run" and row["distinct_used"] == 40.0
    assert row["sol_tok_s"] == pytest.approx(sol_tokens_per_s(mb, 8, 8192, 4.28e12, 40.0))
    assert row["sol_tok_s"] > sol_tokens_per_s(mb, 8, 8192, 4.28e12, 51.4)  # fewer bytes: a higher ceiling
    assert row["stock_pct_sol"] == pytest.approx(100 * 1600 / row["sol_tok_s"])
    assert other["distinct_source"] == "uniform"  # a case without either count keeps the formula
    table = report.markdown(result)
    assert "| 8 | 8K | 1600 (1568-1616) | 2400 (2352-2424) | 1.50x | 40.0 (run) |" in table
    assert "batch 8, 8K: the routing probe's 51.4" in table


def test_a_decode_batch_runs_at_the_smallest_cuda_graph_size_that_holds_it():
    from benchmarks.decode_sweep import graph_batch

    assert [graph_batch(b, [1, 2, 4, 8, 16]) for b in (1, 3, 8, 9, 17)] == [1, 4, 8, 16, 17]
    assert graph_batch(5, None) == 5


def test_a_stock_only_baseline_says_so_and_plots_no_speedup(config, tmp_path):
    result = recorded(config)
    result["cases"] = [c for c in result["cases"] if c["side"] == "stock"]
    del result["sides"]["megakernel"]
    result["env"]["prefix_caching"] = True
    table = report.markdown(result)
    assert table.startswith("**Stock vLLM only**") and "ran stock vLLM" not in table
    assert "prefix-cached by the warm-up" in table
    assert "| 8 | 8K | 1600 (1568-1616) | - (not run) | - |" in table
    assert [p.name for p in report.plots(result, tmp_path)] == ["toks_vs_batch.png", "pct_sol.png"]


def sweep_args(**changes) -> argparse.Namespace:
    """decode_sweep's parsed options as worker_command reads them (greedy, fitted max_model_len, no prompt cache, a
    dummy model and 8 new tokens), with ``changes`` on top."""
    return argparse.Namespace(**(dict(uniform_routing=False, probe_routing=True, model="m", load_format="dummy",
                                      new_tokens=8, repeats=3, gpu_memory_utilization=0.9, seed=0, temperature=0.0,
                                      cache_prompts=False, max_model_len=None) | changes))


def test_uniform_routing_simulates_both_sides_and_its_sol_uses_the_uniform_formula(config, tmp_path, monkeypatch):
    from benchmarks import decode_sweep

    # an exported simulation variable never leaks into a worker: the flag alone decides, so env says what ran
    monkeypatch.setenv("VLLM_MOE_ROUTING_SIMULATION_STRATEGY", "uniform_random")

    args = sweep_args(uniform_routing=True)
    stock_cmd, stock_env = decode_sweep.worker_command(args, "stock", [], tmp_path / "s.json")
    mk_cmd, mk_env = decode_sweep.worker_command(args, "megakernel", [], tmp_path / "m.json")
    for cmd, env in ((stock_cmd, stock_env), (mk_cmd, mk_env)):  # the megakernel simulates it too
        assert env["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] == "uniform_random"
        assert "--no-probe-routing" in cmd  # the weights' routing is not what either side runs
    args.uniform_routing = False
    plain_cmd, plain_env = decode_sweep.worker_command(args, "stock", [], tmp_path / "s.json")
    assert "--no-probe-routing" not in plain_cmd and "VLLM_MOE_ROUTING_SIMULATION_STRATEGY" not in plain_env

    result = recorded(config)
    result["env"]["routing_simulation"] = "uniform_random (both sides)"
    table = report.markdown(result)
    assert table.startswith("**Routing simulated** (uniform_random (both sides))")
    assert "the megakernel draws its experts from a hash instead of torch.randint, distinct within a row" in table
    uniform8 = expected_distinct_experts(config["num_experts"], config["num_experts_per_tok"], 8)
    assert f"| 8 | 8K | 1600 (1568-1616) | 2400 (2352-2424) | 1.50x | {uniform8:.1f} (uniform) |" in table
    assert "Routing simulated" not in report.markdown(recorded(config))
    # each side's % of SOL counts its own draws: stock's simulator repeats experts within a token (torch.randint),
    # so it moves fewer expert bytes than the megakernel's distinct draws and its SOL is higher
    from benchmarks.sol import expected_distinct_experts_with_replacement

    row = next(r for r in report.summarize(result) if r["batch"] == 8 and r["context"] == 8192)
    repeats = expected_distinct_experts_with_replacement(config["num_experts"], config["num_experts_per_tok"], 8)
    assert repeats < uniform8
    stock_sol = sol_tokens_per_s(ModelBytes.from_config(config), 8, 8192, result["bandwidth_bytes_per_s"], repeats)
    assert row["stock_pct_sol"] == pytest.approx(100 * 1600 / stock_sol)
    assert row["megakernel_pct_sol"] == pytest.approx(100 * 2400 / row["sol_tok_s"])


def test_cached_prompts_run_with_vllms_sliding_window_blocks_hashed_only_at_each_prompts_replay_boundary(
        tmp_path, monkeypatch):
    """With --cache-prompts both workers get VLLM_PREFIX_CACHE_RETENTION_INTERVAL=0 (at 8 x 128K vLLM's default
    evicted the window blocks a replay needs, and every timed run prefilled again); without it an exported value
    does not leak into a worker, so the recorded settings say what ran."""
    from benchmarks import decode_sweep

    monkeypatch.setenv("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "4096")
    args = sweep_args(cache_prompts=True)
    for side in ("stock", "megakernel"):
        cmd, env = decode_sweep.worker_command(args, side, [], tmp_path / f"{side}.json")
        assert env["VLLM_PREFIX_CACHE_RETENTION_INTERVAL"] == "0" and "--cache-prompts" in cmd
    args.cache_prompts = False
    cmd, env = decode_sweep.worker_command(args, "stock", [], tmp_path / "s.json")
    assert "VLLM_PREFIX_CACHE_RETENTION_INTERVAL" not in env and "--cache-prompts" not in cmd


def test_a_sampled_sweep_seeds_each_request_alike_on_both_sides_and_every_record_says_it_was_not_greedy(
        config, tmp_path):
    """--temperature T > 0: every request samples with its own seed, a function of (seed, context, index) like its
    prompt, so the two sides' workers (separate processes) draw the same noise and a larger batch's first requests
    are the smaller batch's; the worker command carries it, and the table, merge and the headline's settings say
    so. Greedy (the default, and every run recorded before the key) stays as it was."""
    from benchmarks import decode_sweep, headline

    greedy = decode_sweep.sampling_params(0.0, 8, 0, 1024, 3)
    assert [(p.temperature, p.seed, p.max_tokens, p.ignore_eos) for p in greedy] == [(0.0, None, 9, True)] * 3
    sampled = decode_sweep.sampling_params(1.0, 8, 0, 1024, 3)
    seeds = [p.seed for p in sampled]
    assert all(p.temperature == 1.0 and p.max_tokens == 9 and p.ignore_eos for p in sampled)
    assert len(set(seeds)) == 3 and all(isinstance(x, int) and x >= 0 for x in seeds)
    assert seeds == [p.seed for p in decode_sweep.sampling_params(1.0, 8, 0, 1024, 3)]  # the other side's worker
    assert seeds[:2] == [p.seed for p in decode_sweep.sampling_params(1.0, 8, 0, 1024, 2)]  # nested like prompts
    assert seeds != [p.seed for p in decode_sweep.sampling_params(1.0, 8, 1, 1024, 3)]
    assert seeds != [p.seed for p in decode_sweep.sampling_params(1.0, 8, 0, 2048, 3)]

    args = sweep_args(temperature=1.0)
    for side in ("stock", "megakernel"):
        cmd, _ = decode_sweep.worker_command(args, side, [], tmp_path / f"{side}.json")
        assert cmd[cmd.index("--temperature") + 1] == "1.0"
    with pytest.raises(SystemExit):
        decode_sweep.main(["--model", "m", "--temperature", "-0.5"])
    assert decode_sweep.sampling_name(0.0) == "greedy"

    old = recorded(config)  # recorded before the env had a sampling key: greedy
    new_greedy = copy.deepcopy(old)
    new_greedy["env"]["sampling"] = decode_sweep.sampling_name(0.0)
    hot = copy.deepcopy(old)
    hot["env"]["sampling"] = decode_sweep.sampling_name(1.0)
    assert "sampled" not in report.markdown(old) and report.markdown(old) == report.markdown(new_greedy)
    assert "Tokens sampled at temperature 1, a seed per request, the same seeds on both sides" in report.markdown(hot)
    old["command"], new_greedy["command"], hot["command"] = "run a", "run b", "run c"
    for case in new_greedy["cases"]:
        case["context"] *= 4  # other cases, so the two runs may merge
    assert report.merge([old, new_greedy])["env"].get("sampling", "greedy") == "greedy"
    for case in hot["cases"]:
        case["context"] *= 2
    with pytest.raises(ValueError, match="runs differ in env.sampling: 'greedy' vs 'temperature 1, a seed per request'"):
        report.merge([old, hot])
    old["env"]["load_format"] = hot["env"]["load_format"] = "dummy"
    assert headline._sweep_settings(old) == "dummy weights, 1000 new tokens, median of 3 runs"
    assert headline._sweep_settings(hot) == ("dummy weights, 1000 new tokens, tokens sampled at temperature 1, "
                                             "a seed per request, median of 3 runs")


def test_a_sweep_cut_short_keeps_the_cases_it_finished(config, tmp_path):
    from benchmarks import decode_sweep

    cases = [{"batch": b, "context": 8192} for b in (1, 8, 64)]
    finished = [{"side": "stock", "batch": 1, "context": 8192, "status": "ok", "per_request_tok_s": [200.0] * 3,
                 "use_megakernel": False, "decision": "off"}]
    part = tmp_path / "stock.json"
    part.write_text(json.dumps(finished))
    got, side = decode_sweep.collect_side("stock", cases, part, returncode=124)
    assert [(c["batch"], c["status"]) for c in got] == [(1, "ok"), (8, "failed"), (64, "failed")]
    assert "exit 124" in got[1]["reason"] and side == {"use_megakernel": False, "decision": "off"}
    got, side = decode_sweep.collect_side("megakernel", cases, tmp_path / "absent.json", returncode=1)
    assert all(c["status"] == "failed" for c in got) and "exit 1" in side["decision"]

    result = recorded(config)
    result["cases"] = [c for c in result["cases"] if c["side"] == "stock"] + got
    rows = report.summarize(result)
    cut = [r for r in rows if r["context"] == 8192 and r["batch"] in (1, 8, 64)]
    assert cut and all(r["megakernel"] is None and "exit 1" in r["megakernel_note"] for r in cut)


def test_a_sweep_stopped_from_outside_stops_its_worker_and_writes_what_it_finished(tmp_path):
    """What a time limit does: SIGTERM to the orchestrator while a worker runs. The worker here is a stand-in
    that records one finished case and then hangs; the orchestrator must end it and still write
    results.json and table.md with that case and every other case marked as stopped."""
    import signal
    import subprocess
    import sys
    import time

    finished = {"side": "stock", "batch": 1, "context": 1024, "status": "ok", "per_request_tok_s": [200.0] * 3,
                "use_megakernel": False, "decision": "off"}
    code = f"""
import json, sys
from benchmarks import decode_sweep, sol
sol.measure_bandwidth = lambda: 4.0e12
decode_sweep.environment = lambda args: {{"gpu": "stand-in", "repeats": 3}}
def stand_in(args, side, cases, part):
    body = "import pathlib, time; pathlib.Path(%r).write_text(%r); time.sleep(120)" % (str(part), {json.dumps([finished])!r})
    return [sys.executable, "-c", body], None
decode_sweep.worker_command = stand_in
decode_sweep.main(["--model", {str(FULL_CONFIG)!r}, "--batch-sizes", "1,8", "--contexts", "1024",
                   "--new-tokens", "8", "--out", {str(tmp_path)!r}])
"""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.time() + 60
    while not (tmp_path / "stock.json").exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    t = time.time()
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0 and time.time() - t < 30, out
    result = json.loads((tmp_path / "results.json").read_text())
    status = {(c["side"], c["batch"]): (c["status"], c.get("reason", "")) for c in result["cases"]}
    assert status[("stock", 1)] == ("ok", "")
    for key in (("stock", 8), ("megakernel", 1), ("megakernel", 8)):
        assert status[key][0] == "failed" and "stopped by SIGTERM" in status[key][1], key
    assert "| 1 | 1K | 200 (200-200) |" in (tmp_path / "table.md").read_text()


def test_every_script_that_calls_apply_model_lets_vllm_pickle_the_function():
    """LLM.apply_model ships a Python function to vLLM's engine process, which vLLM refuses unless
    VLLM_ALLOW_INSECURE_SERIALIZATION is set: a harness script that calls it must set it itself."""
    scripts = list((REPO / "benchmarks").glob("*.py")) + list((REPO / "tests" / "gpu").glob("*.py"))
    callers = [p for p in scripts if ".apply_model(" in p.read_text()]
    assert {p.name for p in callers} >= {"greedy.py", "decode_sweep.py", "stepwise_compare.py"}
    sets_it = re.compile(r'environ(\.setdefault\(|\[)"VLLM_ALLOW_INSECURE_SERIALIZATION"')
    for p in callers:
        assert sets_it.search(p.read_text()), p.name


def test_sweep_prompts_are_shared_by_both_sides_and_nested_across_batch_sizes():
    from benchmarks.decode_sweep import prompt_ids

    small = [prompt_ids(0, 1024, i) for i in range(4)]
    assert small == [prompt_ids(0, 1024, i) for i in range(8)][:4]  # batch 8 = batch 4's prompts + 4 new
    assert all(len(p) == 1024 and min(p) >= 10 for p in small)
    assert len({tuple(p) for p in small}) == 4  # distinct requests, not one prompt repeated
    assert prompt_ids(1, 1024, 0) != prompt_ids(0, 1024, 0)


def test_runs_split_across_gpus_merge_into_one_table_each_case_keeping_its_own_bandwidth(config, tmp_path):
    whole = recorded(config)
    short, long_ = copy.deepcopy(whole), copy.deepcopy(whole)
    short["cases"] = [c for c in whole["cases"] if c["context"] <= 1024]
    long_["cases"] = [c for c in whole["cases"] if c["context"] > 1024]
    short["bandwidth_bytes_per_s"], short["command"], long_["command"] = 4.0e12, "run a", "run b"
    for i, run in enumerate((short, long_)):
        (tmp_path / f"run{i}").mkdir()
        (tmp_path / f"run{i}" / "results.json").write_text(json.dumps(run))
    report.main(["merge", "--out", str(tmp_path / "merged"), str(tmp_path / "run0"), str(tmp_path / "run1")])
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert len(merged["cases"]) == len(whole["cases"]) and merged["command"] == ["run a", "run b"]
    rows = {(r["batch"], r["context"]): r for r in report.summarize(merged)}
    alone = {(r["batch"], r["context"]): r for r in report.summarize(whole)}
    assert rows[(8, 8192)]["sol_tok_s"] == pytest.approx(alone[(8, 8192)]["sol_tok_s"])  # its run's 4.28 TB/s
    assert rows[(8, 1024)]["sol_tok_s"] == pytest.approx(alone[(8, 1024)]["sol_tok_s"] * 4.0 / 4.28)
    table = (tmp_path / "merged" / "table.md").read_text()
    assert "HBM bandwidth measured 4.00-4.28 TB/s in the 2 runs merged here" in table
    assert table == report.markdown(merged)  # what the regeneration test will check for a committed merge

    with pytest.raises(ValueError, match="new_tokens"):
        report.merge([short, {**long_, "new_tokens": 256}])
    with pytest.raises(ValueError, match="env.repeats"):
        report.merge([short, {**long_, "env": {**long_["env"], "repeats": 5}}])
    with pytest.raises(ValueError, match="finished in more than one run"):
        report.merge([short, short])
    # a merge is itself a part: adding a third run keeps flat lists of commands and bandwidths
    third = copy.deepcopy(whole)
    third["cases"] = [{**c, "context": 2048} for c in whole["cases"] if c["context"] == 1024]
    third["bandwidth_bytes_per_s"], third["command"] = 4.1e12, "run c"
    again = report.merge([merged, third])
    assert again["command"] == ["run a", "run b", "run c"] and again["run_bandwidths"] == [4.0e12, 4.28e12, 4.1e12]


def test_a_case_a_run_did_not_finish_yields_to_the_same_case_measured_in_a_rerun(config):
    """On the H200 a time limit stopped the 32K sweep before batch 64; that case was re-run alone and the two
    runs merged: the measured case replaces the unfinished one, in either order, and is counted once."""
    whole = recorded(config)
    ok = next(c for c in whole["cases"] if c["status"] == "ok")
    key = (ok["side"], ok["batch"], ok["context"])
    cut, rerun = copy.deepcopy(whole), copy.deepcopy(whole)
    for c in cut["cases"]:
        if (c["side"], c["batch"], c["context"]) == key:
            c.update(status="failed", reason="the stock engine stopped (stopped by SIGTERM) before this case")
            c.pop("per_request_tok_s", None)
    rerun["cases"], rerun["bandwidth_bytes_per_s"] = [copy.deepcopy(ok)], 4.1e12
    cut["command"], rerun["command"] = "run a", "run b"
    for parts in ([cut, rerun], [rerun, cut]):
        merged = report.merge(parts)
        hits = [c for c in merged["cases"] if (c["side"], c["batch"], c["context"]) == key]
        assert len(merged["cases"]) == len(whole["cases"]) and len(hits) == 1
        assert hits[0]["status"] == "ok" and hits[0]["per_request_tok_s"] == ok["per_request_tok_s"]
        assert hits[0]["bandwidth_bytes_per_s"] == 4.1e12  # the run that measured it
        assert [(x["batch"], x["context"]) for x in merged["superseded"]] == [key[1:]]  # not silently dropped
        assert "one merged run did not finish it (the stock engine stopped" in report.markdown(merged)
    stopped = {**cut, "cases": [c for c in cut["cases"] if c["status"] == "failed"]}
    twice = report.merge([stopped, copy.deepcopy(stopped)])  # unfinished in both: kept once, as failed
    assert [(c["batch"], c["context"], c["status"]) for c in twice["cases"]] == [(key[1], key[2], "failed")]
    assert twice["superseded"] == []  # nothing finished it, so nothing was superseded
    merged = report.merge([cut, rerun])
    again = report.merge([merged, copy.deepcopy(stopped)])  # the same unfinished copy once more
    assert again["superseded"] == merged["superseded"] and len(again["superseded"]) == 1


def test_a_side_stopped_before_it_finished_anything_does_not_veto_the_merge(config, tmp_path):
    """A run stopped while its megakernel side was still starting records that side as not running the
    megakernel (all it knows is that the engine stopped); the re-run that measured the side decides."""
    from benchmarks import decode_sweep

    whole = recorded(config)
    mk_cases = [{"batch": c["batch"], "context": c["context"]} for c in whole["cases"] if c["side"] == "megakernel"]
    assert mk_cases and whole["sides"]["megakernel"]["use_megakernel"]
    got, info = decode_sweep.collect_side("megakernel", mk_cases, tmp_path / "absent.json", "stopped by SIGTERM")
    cut = copy.deepcopy(whole)
    cut["cases"] = [c for c in whole["cases"] if c["side"] != "megakernel"] + got
    cut["sides"]["megakernel"], cut["command"] = info, "run a"
    assert info["use_megakernel"] is False
    rerun = copy.deepcopy(whole)
    rerun["cases"], rerun["command"] = [c for c in whole["cases"] if c["side"] == "megakernel"], "run b"
    for parts in ([cut, rerun], [rerun, cut]):
        merged = report.merge(parts)
        assert merged["sides"]["megakernel"] == whole["sides"]["megakernel"]
        assert len(merged["superseded"]) == len(mk_cases)
    # a side that did finish cases with and without the megakernel is still refused
    stock_side = copy.deepcopy(rerun)
    stock_side["sides"]["megakernel"] = {"use_megakernel": False, "decision": "fell back"}
    with pytest.raises(ValueError, match="ran the megakernel in one run and not in another"):
        report.merge([whole, {**stock_side, "cases": [{**c, "context": 4096} for c in stock_side["cases"]]}])


def test_the_sweep_worker_skips_a_batch_its_engines_kv_cache_cannot_run_at_once(config, tmp_path, monkeypatch):
    """The worker against a stand-in for vllm.LLM: its engine config (blocks, block size, batched tokens,
    hybrid-manager switch) decides which cases are timed. 58 sequences of 32K fit 168,162 blocks at once,
    59 do not; only the fitting case is generated."""
    import types

    import vllm

    from benchmarks import decode_sweep

    clock = types.SimpleNamespace(now=0.0)
    added, engine_lens = [], []

    class Engine(_FakeEngine):  # 100 tokens/s per request once decoding
        def add_request(self, request_id, prompt, params):
            added.append(request_id)
            super().add_request(request_id, prompt, params)

    class FakeLLM:
        def __init__(self, **kw):
            engine_lens.append(kw["max_model_len"])
            self.llm_engine = Engine(clock, prefill_s=2.0, step_s=0.01, per_prefill=1000)
            self.llm_engine.vllm_config = types.SimpleNamespace(
                cache_config=types.SimpleNamespace(num_gpu_blocks=168162, block_size=16),
                scheduler_config=types.SimpleNamespace(max_num_batched_tokens=16384,
                                                       disable_hybrid_kv_cache_manager=False))

        def apply_model(self, fn):
            return [{"use_megakernel": False, "decision": "stock"}]

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    out = tmp_path / "stock.json"
    args = argparse.Namespace(side="stock", model=str(FULL_CONFIG), load_format="dummy", cache_prompts=True,
                              new_tokens=256, repeats=1, gpu_memory_utilization=0.9, seed=0, temperature=0.0, out=out,
                              probe_routing=False, max_model_len=None,
                              cases=json.dumps([{"batch": 58, "context": 32768}, {"batch": 59, "context": 32768}]))
    monkeypatch.setattr(decode_sweep, "prompt_ids", lambda seed, ctx, i: [1])
    monkeypatch.setattr(decode_sweep.time, "perf_counter", lambda: clock.now)
    decode_sweep.worker(args)
    fit, unfit = json.loads(out.read_text())
    assert fit["status"] == "ok" and fit["kv_blocks_needed"] <= 168161 and fit["max_num_batched_tokens"] == 16384
    assert fit["per_request_tok_s"] == [pytest.approx(100.0)]
    assert unfit["status"] == "skipped" and "does not fit the KV cache" in unfit["reason"]
    assert len(added) == 58 * 2  # a warm-up run and one timed run, both of the batch that fits
    assert engine_lens == [32768 + 256 + decode_sweep.LEN_MARGIN]  # fitted to the longest context by default
    args.max_model_len = 262144  # --max-model-len: the engine gets it as given
    decode_sweep.worker(args)
    assert engine_lens[1:] == [262144]


def test_a_context_past_the_models_positions_is_refused_up_front_naming_the_longest_that_fits(config, capsys):
    from benchmarks import decode_sweep

    limit = config["max_position_embeddings"]
    decode_sweep.check_contexts([1024, limit - 256 - 16], 256, config)  # fits exactly
    with pytest.raises(ValueError, match=f"longest context that fits is {limit - 272}"):
        decode_sweep.check_contexts([1024, limit], 256, config)
    with pytest.raises(SystemExit):  # the CLI says so before measuring or starting any engine
        decode_sweep.main(["--model", str(FULL_CONFIG), "--contexts", str(limit), "--new-tokens", "256"])
    assert f"exceed the model's {limit} positions" in capsys.readouterr().err


def test_a_sweep_at_a_given_max_model_len_carries_it_to_both_workers_and_every_record_says_so(config, tmp_path):
    """--max-model-len N (a server's default is the model's positions, and vLLM copies each step's block-table rows
    at that width): both workers' engines get N, contexts that N cannot hold are refused up front, the env records
    it, the table and the headline's settings say so, and merge refuses a run at N with a fitted one (a run
    recorded before the key was fitted)."""
    from benchmarks import decode_sweep, headline

    positions = config["max_position_embeddings"]
    args = sweep_args(max_model_len=positions)
    for side in ("stock", "megakernel"):
        cmd, _ = decode_sweep.worker_command(args, side, [], tmp_path / f"{side}.json")
        assert cmd[cmd.index("--max-model-len") + 1] == str(positions)
    args.max_model_len = None
    assert "--max-model-len" not in decode_sweep.worker_command(args, "stock", [], tmp_path / "s.json")[0]

    decode_sweep.check_contexts([2048 - 256 - 16], 256, config, 2048)  # fits exactly
    with pytest.raises(ValueError, match="exceed --max-model-len 2048; the longest context that fits is 1776"):
        decode_sweep.check_contexts([2048], 256, config, 2048)
    with pytest.raises(ValueError, match="outside the model's"):
        decode_sweep.check_contexts([1024], 256, config, positions + 1)

    old = recorded(config)  # recorded before the env had the key: fitted
    wide = copy.deepcopy(old)
    wide["env"]["max_model_len"] = positions
    assert "max_model_len" not in report.markdown(old)
    assert f"Both engines at max_model_len {positions}, not fitted to the contexts" in report.markdown(wide)
    old["command"], wide["command"] = "run a", "run b"
    for case in wide["cases"]:
        case["context"] *= 2
    with pytest.raises(ValueError, match=f"runs differ in env.max_model_len: 'fitted' vs {positions}"):
        report.merge([old, wide])
    wide["env"]["load_format"] = "dummy"
    assert headline._sweep_settings(wide) == (f"dummy weights, 1000 new tokens, max_model_len {positions}, "
                                              "median of 3 runs")


def test_plots_are_png_files(config, tmp_path):
    paths = report.plots(recorded(config), tmp_path)
    assert [p.name for p in paths] == ["toks_vs_batch.png", "speedup_vs_context.png", "pct_sol.png"]
    for p in paths:
        head = p.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", head[16:24])
        assert width > 300 and height > 200


def test_serving_log_and_bench_result_parsing():
    from benchmarks import serve_load

    log = ("INFO 11-30 [kv_cache_utils.py:2146] GPU KV cache size: 1,234,567 tokens\n"
           "(EngineCore pid=1) INFO [cohere2_moe.py:95] vllm_megakernel: decode runs on stock vLLM: LoRA is on\n")
    assert serve_load.parse_server_log(log) == {
        "kv_cache_tokens": 1234567, "decision": "vllm_megakernel: decode runs on stock vLLM: LoRA is on"}
    assert serve_load.parse_server_log("nothing") == {"kv_cache_tokens": None, "decision": None}
    row = serve_load.bench_row({"max_concurrency": 8, "completed": 32, "failed": 0, "output_throughput": 1500.5,
                                "median_tpot_ms": 5.1, "median_ttft_ms": 40.0, "p99_tpot_ms": 6.0})
    assert row["output_tok_s"] == 1500.5 and row["concurrency"] == 8
    table = serve_load.markdown({"sides": {"stock": {"rows": [row], "peak_gpu_gib": 120.4,
                                                     "kv_cache_tokens": 1234567, "decision": "off"}}})
    assert "| stock | 8 | 32 / 0 | 1500 | 5.10 | 40.0 | 120.4 | 1234567 |" in table


def test_a_detailed_bench_result_keeps_each_requests_latencies_and_not_its_text(tmp_path):
    from benchmarks import serve_load

    path = tmp_path / "bench-megakernel-c1.json"
    path.write_text(json.dumps({"median_ttft_ms": 101.6, "ttfts": [0.1, 0.09], "itls": [[0.003], [0.002]],
                                "generated_texts": ["a" * 1000, "b" * 1000]}))
    kept = serve_load.drop_generated_texts(path)
    assert kept == json.loads(path.read_text()) == {"median_ttft_ms": 101.6, "ttfts": [0.1, 0.09],
                                                    "itls": [[0.003], [0.002]]}


def test_gpu_memory_sampler_stops_cleanly_and_reads_the_visible_gpu(monkeypatch):
    import time

    from benchmarks import gpu_memory, serve_load

    sampler = serve_load.GpuMemorySampler(period_s=0.01)
    sampler.start()
    sampler.stop()  # on a machine without nvidia-smi the reads fail quietly; stopping must still work
    assert not sampler.is_alive()
    assert sampler.peak_gib is None  # no reading is unknown, not 0 GiB

    calls = []

    def fake_smi(cmd, **kw):
        calls.append(cmd)
        return argparse.Namespace(stdout="40960, 143771\n")

    monkeypatch.setattr(gpu_memory.subprocess, "run", fake_smi)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    sampler = serve_load.GpuMemorySampler(period_s=0.01)
    sampler.start()
    while not calls:
        time.sleep(0.001)
    sampler.stop()
    assert sampler.peak_gib == 40.0 and calls[0][:3] == ["nvidia-smi", "-i", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc,GPU-def")
    assert gpu_memory.visible_gpu() == "GPU-abc"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_memory.visible_gpu() == "0"


def test_accuracy_sides_run_apart_are_compared_from_one_out_folder(tmp_path):
    from benchmarks import accuracy

    assert accuracy.summary_of(tmp_path) == {"lm_eval": {}, "greedy": None}
    stock = {"model_class": "vllm:Cohere2MoeForCausalLM", "tokens": [[1, 2, 3]], "logprobs": [[{"1": -0.1}] * 3]}
    (tmp_path / "greedy-stock.json").write_text(json.dumps(stock))
    assert accuracy.summary_of(tmp_path)["greedy"] is None  # one side alone is not a comparison
    (tmp_path / "greedy-megakernel.json").write_text(json.dumps({**stock, "tokens": [[1, 2, 4]]}))
    summary = accuracy.summary_of(tmp_path)
    assert summary["greedy"]["first_divergence"] == [2]
    assert set(summary["model_class"]) == {"stock", "megakernel"}

    # both lm-eval runs there, one without its samples file (lm-eval only warns when it cannot write it, and
    # a side that finishes first can look while the other is between its results and its samples)
    for side in ("stock", "megakernel"):
        run = tmp_path / f"lm_eval-{side}" / "model"
        run.mkdir(parents=True)
        (run / "results_1.json").write_text(json.dumps({"results": {"nmc_gen": {"exact_match,none": 0.0}}}))
    (tmp_path / "lm_eval-stock" / "model" / "samples_nmc_gen_1.jsonl").write_text(
        json.dumps({"doc_id": 0, "resps": [["12"]]}) + "\n")
    summary = accuracy.summary_of(tmp_path)
    assert "no lm-eval samples of nmc_gen" in summary["nmc_gen_agreement"]["error"]
    assert summary["greedy"]["first_divergence"] == [2]  # the rest of the summary survives
    (tmp_path / "lm_eval-megakernel" / "model" / "samples_nmc_gen_1.jsonl").write_text(
        json.dumps({"doc_id": 0, "resps": [["13"]]}) + "\n")
    assert accuracy.summary_of(tmp_path)["nmc_gen_agreement"] == {"items": 1, "identical": 0,
                                                                   "differing_doc_ids": [0]}

    # a greedy file from a run with other settings is refused, not compared
    (tmp_path / "greedy-stock.json").write_text(json.dumps({**stock, "settings": {"max_tokens": 64}}))
    with pytest.raises(ValueError, match="different settings"):
        accuracy.summary_of(tmp_path)


def test_serving_sides_run_apart_are_reported_together(tmp_path):
    from benchmarks import serve_load

    row = {"concurrency": 1, "completed": 8, "failed": 0, "output_tok_s": 165.0, "median_tpot_ms": 4.75,
           "median_ttft_ms": 122.6, "p99_tpot_ms": 5.0}
    settings = serve_load.settings_of(argparse.Namespace(model="m", load_format="dummy", concurrency=[1, 8],
                                                         input_len=1024, output_len=128, prompts_per_concurrency=1))
    (tmp_path / "side-megakernel.json").write_text(json.dumps(
        {"settings": settings, "rows": [row], "peak_gpu_gib": 130.0, "kv_cache_tokens": 1000,
         "decision": "runs on the megakernel", "error": "vllm bench serve failed (exit 1) at concurrency 8"}))
    (tmp_path / "side-stock.json").write_text(json.dumps(
        {"settings": settings, "rows": [row], "peak_gpu_gib": None, "kv_cache_tokens": 2000, "decision": "stock"}))
    summary = serve_load.summary_of(tmp_path)
    assert list(summary["sides"]) == ["stock", "megakernel"]
    table = serve_load.markdown(summary)
    assert "| stock | 1 | 8 / 0 | 165 | 4.75 | 122.6 | - | 2000 |" in table
    assert "| megakernel | 1 | 8 / 0 | 165 | 4.75 | 122.6 | 130.0 | 1000 |" in table
    assert "- megakernel: max_num_seqs 8; runs on the megakernel; vllm bench serve failed (exit 1) at concurrency 8" \
        in table
    # a side left in --out by a run with other settings is refused, not tabled next to this one
    (tmp_path / "side-stock.json").write_text(json.dumps(
        {"settings": {**settings, "output_len": 512}, "rows": [row], "peak_gpu_gib": None, "kv_cache_tokens": 2000}))
    with pytest.raises(ValueError, match="different settings"):
        serve_load.summary_of(tmp_path)
    # and so is one measured before levels began with a warm-up wave (its settings lack the key)
    old = {k: v for k, v in settings.items() if k != "warmup_wave"}
    assert old != settings
    (tmp_path / "side-stock.json").write_text(json.dumps(
        {"settings": old, "rows": [row], "peak_gpu_gib": None, "kv_cache_tokens": 2000}))
    with pytest.raises(ValueError, match="different settings"):
        serve_load.summary_of(tmp_path)


def test_serving_sides_with_fewer_levels_are_compared_where_both_ran(tmp_path):
    from benchmarks import serve_load

    def row(c, tok_s, tpot, failed=0):
        return {"concurrency": c, "completed": 4 * c, "failed": failed, "output_tok_s": tok_s, "median_tpot_ms": tpot,
                "median_ttft_ms": 100.0, "p99_tpot_ms": tpot}

    def settings(levels, max_num_seqs=None):
        return serve_load.settings_of(argparse.Namespace(model="m", load_format="dummy", concurrency=levels,
                                                         input_len=8192, output_len=256, prompts_per_concurrency=4,
                                                         max_num_seqs=max_num_seqs))

    def write(stock, megakernel):
        for side, (st, rows) in (("stock", stock), ("megakernel", megakernel)):
            (tmp_path / f"side-{side}.json").write_text(json.dumps({"settings": st, "rows": rows}))

    # stock ran one level more (its call had more time): compared at the levels both ran, and no further
    write((settings([1, 4, 64]), [row(1, 160.0, 5.6), row(4, 330.0, 10.0), row(64, 2000.0, 30.0)]),
          (settings([1, 4]), [row(1, 270.0, 3.08), row(4, 430.0, 7.0)]))
    table = serve_load.markdown(serve_load.summary_of(tmp_path))
    comparison = table[table.index("| concurrency | output tok/s stock / megakernel"):]
    assert "| 1 | 160 / 270 | 1.69x | 5.60 / 3.08 | 0.55x |" in comparison
    assert "| 4 | 330 / 430 | 1.30x | 10.00 / 7.00 | 0.70x |" in comparison
    assert "| 64 |" not in comparison
    # the servers' sizes followed their largest levels: said under the comparison, and in each side's note
    assert "- stock: max_num_seqs 64" in table and "- megakernel: max_num_seqs 4" in table
    assert "The servers differ in size: max_num_seqs 64 (stock) and 4 (megakernel)" in comparison
    # given one size on both sides, nothing to say
    write((settings([1, 4, 64], 64), [row(1, 160.0, 5.6)]), (settings([1, 4], 64), [row(1, 270.0, 3.08)]))
    assert "differ in size" not in serve_load.markdown(serve_load.summary_of(tmp_path))
    # a level with failed requests, or no throughput, gets no ratio
    write((settings([1, 4]), [row(1, 0.0, 0.0), row(4, 330.0, 10.0)]),
          (settings([1, 4]), [row(1, 270.0, 3.08), row(4, 430.0, 7.0, failed=2)]))
    table = serve_load.markdown(serve_load.summary_of(tmp_path))
    assert "| 1 | 0 / 270 | - | 0.00 / 3.08 | - |" in table and "| 4 | 330 / 430 | - | 10.00 / 7.00 | - |" in table
    # levels run in another order, lists of one length that differ, and a side without levels are refused: a
    # level run after other levels on one server is not the same measurement
    for stock_levels, mk_levels in (([1, 4], [4, 1]), ([1, 4], [1, 8]), ([1, 4], [])):
        write((settings([1, 4]), [row(1, 160.0, 5.6)]),
              ({**settings([1]), "concurrency": mk_levels}, [row(1, 270.0, 3.08)]))
        with pytest.raises(ValueError, match="is not the start"):
            serve_load.summary_of(tmp_path)
    # one side alone gets its rows and no comparison
    (tmp_path / "side-megakernel.json").unlink()
    assert "TPOT ratio" not in serve_load.markdown(serve_load.summary_of(tmp_path))


def test_serving_refuses_a_server_smaller_than_its_largest_level():
    from benchmarks import serve_load

    args = argparse.Namespace(concurrency=[1, 8], max_num_seqs=4)
    with pytest.raises(ValueError, match="below the largest concurrency 8"):
        serve_load.max_num_seqs_of(args)
    assert serve_load.max_num_seqs_of(argparse.Namespace(concurrency=[1, 8], max_num_seqs=None)) == 8
    assert serve_load.max_num_seqs_of(argparse.Namespace(concurrency=[1, 8], max_num_seqs=64)) == 64


class _NoSampler:  # no nvidia-smi here (and subprocess.run is the bench stand-in in the tests below)
    peak_gib = None

    def start(self):
        pass

    def stop(self):
        pass


def _no_gpu_sampling(monkeypatch):
    from benchmarks import serve_load

    monkeypatch.setattr(serve_load, "GpuMemorySampler", _NoSampler)
    monkeypatch.setattr(serve_load, "wait_until_released", lambda: None)


def test_a_serving_side_stopped_between_levels_keeps_the_levels_it_measured(tmp_path, monkeypatch):
    """serve_load writes the side's file after every level: a run killed in its third level (here the bench
    command raises, as a time limit's kill would end the process there) leaves the first two levels in
    side-megakernel.json, marked as stopped before the third, and the table shows them."""
    import contextlib

    from benchmarks import serve_load

    class RunningServer:
        def poll(self):
            return None

    monkeypatch.setattr(serve_load, "served", lambda *a, **k: contextlib.nullcontext(RunningServer()))
    monkeypatch.setattr(serve_load, "exit_cleanly_on_signals", lambda: {})  # leave pytest's own handlers
    _no_gpu_sampling(monkeypatch)

    def bench(cmd, check):
        c = int(cmd[cmd.index("--max-concurrency") + 1])
        if c == 32:
            raise RuntimeError("killed by the time limit")
        (tmp_path / f"bench-megakernel-c{c}.json").write_text(json.dumps(
            {"max_concurrency": c, "completed": 8 * c, "failed": 0, "output_throughput": 100.0 * c,
             "median_tpot_ms": 2.5 + c, "median_ttft_ms": 100.0}))

    monkeypatch.setattr(serve_load.subprocess, "run", bench)
    (tmp_path / "server-megakernel.log").write_text("GPU KV cache size: 1,234 tokens\n")
    with pytest.raises(RuntimeError, match="time limit"):
        serve_load.main(["--model", "m", "--concurrency", "1,8,32", "--sides", "megakernel", "--out", str(tmp_path)])
    side = json.loads((tmp_path / "side-megakernel.json").read_text())
    assert [r["concurrency"] for r in side["rows"]] == [1, 8] and side["kv_cache_tokens"] == 1234
    assert side["error"].startswith("stopped before concurrency 32")
    assert side["settings"]["concurrency"] == [1, 8, 32]
    table = serve_load.markdown(serve_load.summary_of(tmp_path))
    assert "| megakernel | 8 | 64 / 0 | 800 | 10.50 | 100.0 |" in table and "stopped before concurrency 32" in table


def test_levels_measured_after_the_sides_server_exited_are_not_kept(tmp_path, monkeypatch):
    """A level whose server was gone by its end was answered by something else on the port (or by nothing):
    the side keeps the levels before it and says why it stopped."""
    import contextlib

    from benchmarks import serve_load

    levels = []

    class ServerThatDiesInTheSecondLevel:
        returncode = 1

        def poll(self):
            return None if len(levels) < 2 else 1

    def bench(cmd, check):
        c = int(cmd[cmd.index("--max-concurrency") + 1])
        levels.append(c)
        (tmp_path / f"bench-stock-c{c}.json").write_text(json.dumps(
            {"max_concurrency": c, "completed": 8, "failed": 0, "output_throughput": 10.0 * c,
             "median_tpot_ms": 5.0, "median_ttft_ms": 50.0}))

    monkeypatch.setattr(serve_load, "served", lambda *a, **k: contextlib.nullcontext(ServerThatDiesInTheSecondLevel()))
    monkeypatch.setattr(serve_load.subprocess, "run", bench)
    (tmp_path / "server-stock.log").write_text("")
    args = argparse.Namespace(model="m", port=8199, load_format="dummy", concurrency=[1, 8, 32], input_len=16,
                              output_len=16, prompts_per_concurrency=1, startup_timeout=1)

    _no_gpu_sampling(monkeypatch)
    side = serve_load.run_side("stock", args, tmp_path)
    assert levels == [1, 8]  # nothing measured after the server was found gone
    assert [r["concurrency"] for r in side["rows"]] == [1]
    assert side["error"].startswith("server exited with 1 during concurrency 8")
    assert "no megakernel decision" in side["error"]  # its log has no decision line either
    table = serve_load.markdown({"sides": {"stock": side}})  # the side file of a stopped run still tables
    assert "| stock | 1 | 8 / 0 | 10 | 5.00 | 50.0 | - | None |" in table and "server exited with 1" in table


def test_a_serving_side_whose_server_did_not_run_as_that_side_says_so(tmp_path, monkeypatch):
    """The side's own server log must carry the plugin's decision for that side: the megakernel side's server
    runs decode on the megakernel, the stock side's on stock vLLM; no line at all (session AA's stray server,
    whose answers came with an empty log) is flagged too."""
    import contextlib

    from benchmarks import serve_load

    on = ("vllm_megakernel: decode runs on the megakernel for batches of 1 to 64 (the kernel's limit); larger "
          "decode batches, prefill and mixed batches run on stock vLLM")
    off = "vllm_megakernel: decode runs on stock vLLM: disabled by additional_config.megakernel.enabled=false"
    assert serve_load.side_mismatch("megakernel", on) is None and serve_load.side_mismatch("stock", off) is None
    assert "did not run as megakernel" in serve_load.side_mismatch("megakernel", off)
    assert "did not run as stock" in serve_load.side_mismatch("stock", on)
    assert "no megakernel decision" in serve_load.side_mismatch("megakernel", None)

    class Running:
        def poll(self):
            return None

    def bench(cmd, check):
        c = int(cmd[cmd.index("--max-concurrency") + 1])
        (tmp_path / f"bench-megakernel-c{c}.json").write_text(json.dumps(
            {"max_concurrency": c, "completed": 8, "failed": 0, "output_throughput": 10.0,
             "median_tpot_ms": 5.0, "median_ttft_ms": 50.0}))

    monkeypatch.setattr(serve_load, "served", lambda *a, **k: contextlib.nullcontext(Running()))
    monkeypatch.setattr(serve_load.subprocess, "run", bench)
    _no_gpu_sampling(monkeypatch)
    args = argparse.Namespace(model="m", port=8199, load_format="dummy", concurrency=[1], input_len=16,
                              output_len=16, prompts_per_concurrency=1, startup_timeout=1)
    (tmp_path / "server-megakernel.log").write_text(f"(EngineCore pid=1) INFO [cohere2_moe.py:127] {off}\n")
    side = serve_load.run_side("megakernel", args, tmp_path)
    assert side["rows"] and "did not run as megakernel" in side["error"]
    (tmp_path / "server-megakernel.log").write_text(f"(EngineCore pid=1) INFO [cohere2_moe.py:127] {on}\n")
    assert "error" not in serve_load.run_side("megakernel", args, tmp_path)


def test_each_serving_level_is_one_vllm_bench_serve_run_with_an_unmeasured_warm_up_wave(tmp_path):
    """The command is parsed by vLLM 0.24's own `vllm bench serve` argument parser, so a flag it does not
    know, or a value it would read differently, fails here rather than on the GPU host."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from benchmarks import serve_load

    args = argparse.Namespace(model="configs/north-mini-code", port=8200, input_len=1024, output_len=128,
                              prompts_per_concurrency=1)
    cmd = serve_load.bench_command(args, 32, tmp_path, "bench-stock-c32.json")
    assert cmd[2:5] == ["vllm.entrypoints.cli.main", "bench", "serve"]
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    parsed = parser.parse_args(cmd[5:])
    assert (parsed.port, parsed.max_concurrency, parsed.num_warmups, parsed.num_prompts) == (8200, 32, 32, 32)
    assert (parsed.random_input_len, parsed.random_output_len, parsed.ignore_eos) == (1024, 128, True)
    assert (parsed.result_dir, parsed.result_filename, parsed.save_result, parsed.save_detailed) == \
        (str(tmp_path), "bench-stock-c32.json", True, True)
    assert parser.parse_args(serve_load.bench_command(args, 1, tmp_path, "x.json")[5:]).num_prompts == 8  # floor


def test_agreement_metrics():
    from benchmarks.agreement import first_divergence, max_logprob_diff, summarize, top_overlap

    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert top_overlap({"1": -9.0, "2": -9.5}, {"1": -9.0, "3": -9.5}) == 0.5
    assert max_logprob_diff({"1": -9.0, "2": -9.5}, {"1": -9.25, "3": -9.5}) == 0.25
    assert max_logprob_diff({"1": -9.0}, {"2": -9.0}) is None
    step = lambda *tokens: {t: -9.0 - 0.1 * k for k, t in enumerate(tokens)}  # noqa: E731
    s = summarize({"tokens": [[1, 2, 3, 4], [5]], "logprobs": [[step("1", "7"), step("2", "7"), step("3", "8"),
                                                                  step("4")], [step("5")]]},
                  {"tokens": [[1, 2, 3, 9], [6]], "logprobs": [[step("1", "7"), step("2", "6"), step("3", "8"),
                                                                  step("9")], [step("6")]]})
    # prompt 0: decode steps 1 and 2 before the divergence at 3 (step 0 is the prefill's); prompt 1: none
    assert s["first_divergence"] == [3, 0] and s["decode_steps"] == [2, 0]
    assert s["median_top_overlap"] == [0.75, None] and s["min_top_overlap"] == [0.5, None]
    assert s["max_logprob_diff"] == [0.0, None]
    assert s["all_prompts"] == {"decode_steps": 2, "median_top_overlap": 0.75, "median_max_logprob_diff": 0.0}


def test_agreement_tells_the_committed_greedy_runs_from_unrelated_steps():
    """On session W's greedy files (5-layer random checkpoint, 256 tokens; session AD's are byte-identical) the decode steps before each first
    divergence list nearly the same top-20 tokens with logprobs a few hundredths apart, while the same
    megakernel steps paired with another prompt's share none: the metric can fail. (The cosine it replaces was
    0.9987-0.9998 between unrelated steps.)"""
    from benchmarks.accuracy import greedy_files
    from benchmarks.agreement import summarize

    greedy = greedy_files(REPO / "benchmarks" / "results" / "h200-2026-12-04-v2-session-w" / "call4" / "accuracy")
    stock, mk = greedy["stock"], greedy["megakernel"]
    s = summarize(stock, mk)["all_prompts"]  # what the GPU greedy tests ask: >= 0.8 and <= 0.1 nat
    assert s["decode_steps"] == 17 and s["median_top_overlap"] >= 0.9 and s["median_max_logprob_diff"] <= 0.05
    shifted = {"tokens": stock["tokens"], "logprobs": mk["logprobs"][1:] + mk["logprobs"][:1]}
    unrelated = summarize(stock, shifted)["all_prompts"]
    assert unrelated["median_top_overlap"] == 0.0


def test_local_lm_eval_tasks_load_offline_and_score(tmp_path):
    """The task YAML + JSONL run through lm-eval itself (its dummy model), without network."""
    import os
    import subprocess

    pytest.importorskip("lm_eval", reason="lm-eval is not installed")
    from benchmarks.accuracy import (generation_agreement, generations, lm_eval_cmd, materialize_tasks,
                                     read_lm_eval_results)

    tasks = materialize_tasks(tmp_path / "tasks")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(lm_eval_cmd("", "dummy", tasks, tmp_path / "out", limit=5), capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = read_lm_eval_results(tmp_path / "out")
    assert set(res) == {"nmc_mc", "nmc_gen"}
    assert 0.0 <= res["nmc_mc"]["acc"] <= 1.0 and 0.0 <= res["nmc_gen"]["exact_match"] <= 1.0
    generated = generations(tmp_path / "out")  # lm-eval's own --log_samples file
    assert sorted(generated) == list(range(5)) and all(isinstance(t, str) for t in generated.values())
    assert generation_agreement(generated, generated) == {"items": 5, "identical": 5, "differing_doc_ids": []}
    assert generation_agreement(generated, {**generated, 3: generated[3] + "x"})["differing_doc_ids"] == [3]


def test_task_answers_are_right_by_construction():
    from benchmarks.tasks.make_tasks import HERE

    for line in (HERE / "nmc_mc.jsonl").read_text().splitlines():
        item = json.loads(line)
        expr = item["question"].split("expression ")[1].split(" evaluate")[0]
        assert item["choices"][item["label"]] == str(eval(expr))  # noqa: S307


def test_routing_probe_counts_distinct_experts(tiny_checkpoint):
    import torch

    from benchmarks.routing_probe import distinct_experts
    from conftest import TINY_CONFIG
    from vllm_megakernel import reference as ref

    dims = ref.ModelDims.from_config(TINY_CONFIG)
    w = ref.Weights.from_checkpoint(tiny_checkpoint, dims, dtype=torch.float32)
    assert distinct_experts(dims, w, batch=1) == dims.top_k  # one token: its k experts, all distinct
    d8 = distinct_experts(dims, w, batch=8)
    assert dims.top_k < d8 <= min(dims.num_experts, 8 * dims.top_k)


def test_served_waits_for_health_and_stops_the_server(tmp_path):
    import socket
    import sys
    import urllib.request

    from benchmarks.serve_load import ServerError, served

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import http.server as h\n"
            "class H(h.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200 if self.path == '/health' else 404); self.end_headers()\n"
            f"h.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    with served([sys.executable, "-c", code], port, tmp_path / "log", startup_timeout=30) as proc:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200
    assert proc.poll() is not None  # stopped on exit
    with pytest.raises(ServerError, match="exited with 3"):
        with served([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], port, tmp_path / "log2", 30):
            pass


RECORDED = committed_results("results.json", lambda text: "sides" in json.loads(text))  # the decode sweeps


@pytest.mark.parametrize("results", RECORDED, ids=[result_id(p) for p in RECORDED])
def test_committed_results_regenerate_their_table(results, tmp_path):
    """Every committed sweep's table.md is what the report code makes of its results.json, so a committed
    table cannot drift from its data (or from the report code) unnoticed."""
    recorded = json.loads(results.read_text())
    assert (results.parent / "table.md").read_text() == report.markdown(recorded)
    report.plots(recorded, tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(p.name for p in results.parent.glob("*.png"))


@pytest.mark.parametrize("results", RECORDED, ids=[result_id(p) for p in RECORDED])
def test_every_committed_measured_case_fit_the_kv_cache(results):
    """A case shown as measured had its whole batch resident in its engine's KV cache, counted per vLLM
    KV-cache group (benchmarks.kv_fit). Runs from before kv_fit recorded blocks x block size as
    kv_capacity_tokens (block size 16)."""
    recorded = json.loads(results.read_text())
    groups = kv_groups(recorded["config"])
    for c in recorded["cases"]:
        if c["status"] == "ok":
            blocks = c["kv_blocks"] if "kv_blocks" in c else c["kv_capacity_tokens"] // 16
            need = case_blocks_needed(groups, c["batch"], c["context"], recorded["new_tokens"],
                                      c.get("max_num_batched_tokens", H200_BATCHED))
            assert need <= usable_blocks(blocks), f"batch {c['batch']} at {c['context']}: {need} blocks, {blocks} there"


def test_the_committed_stock_grid_is_its_parts_merged_with_unfitting_cases_marked():
    """results.json is exactly `report merge` of parts/ (each run's own output) plus the KV-fit check those
    runs predate: nothing in it was edited by hand."""
    folder = REPO / "benchmarks" / "results" / "h200-2026-11-30-stock-grid"
    parts = [json.loads(p.read_text()) for p in sorted((folder / "parts").glob("part*.json"))]
    assert len(parts) == 4
    expected = mark_cases_that_do_not_fit(report.merge(parts), H200_BATCHED)
    assert json.loads((folder / "results.json").read_text()) == json.loads(json.dumps(expected))
    unfit = [(c["batch"], c["context"]) for c in expected["cases"] if "does not fit" in c.get("reason", "")]
    assert unfit == [(64, 32768)]


# A results folder's serve.json, or its serve-LENGTH/ folder's where the sides were joined there (session AL); the
# per-call folders deeper down hold one side each as serve_load wrote them then, and are not re-derived here.
SERVED = sorted([*(REPO / "benchmarks" / "results").glob("*/serve.json"),
                 *(REPO / "benchmarks" / "results").glob("*/serve-*/serve.json")])
ACCURACY = sorted((REPO / "benchmarks" / "results").glob("**/accuracy.json"))


@pytest.mark.parametrize("serve", SERVED, ids=[str(p.parent.relative_to(REPO / "benchmarks" / "results")) for p in SERVED])
def test_committed_serving_results_are_what_their_side_files_give(serve):
    """A committed serve.json and serve.md are the summary serve_load makes of the folder's side files."""
    from benchmarks import itl_split, serve_load

    summary = serve_load.summary_of(serve.parent)
    assert json.loads(serve.read_text()) == summary
    assert (serve.parent / "serve.md").read_text().strip() == serve_load.markdown(summary).strip()
    benches = itl_split.load_benches(serve.parent)  # vLLM bench's result files, loose or packed in bench.tar.xz
    for side, s in summary["sides"].items():  # and the side files are what vLLM's own outputs say
        # every level vLLM's bench wrote a result for (a call's time limit may have stopped the side before the last)
        bench = [b for c in s["settings"]["concurrency"] if (b := benches.get(f"bench-{side}-c{c}.json"))]
        assert s["rows"] == [serve_load.bench_row(b) for b in bench]
        log = serve_load.parse_server_log((serve.parent / f"server-{side}.log").read_text())
        assert (s["kv_cache_tokens"], s["decision"]) == (log["kv_cache_tokens"], log["decision"])


@pytest.mark.parametrize("acc", ACCURACY, ids=[str(p.parent.relative_to(REPO / "benchmarks" / "results")) for p in ACCURACY])
def test_committed_accuracy_is_what_its_lm_eval_and_greedy_files_give(acc):
    """A committed accuracy.json is the summary the accuracy tool makes of the folder's lm-eval output and
    greedy files (the newest lm-eval pass of each side). Floats are compared to 12 significant digits:
    Python 3.12's sum() (the GPU host's) rounds differently from 3.11's in the last bit."""
    from benchmarks import accuracy

    def rounded(x):
        if isinstance(x, float):
            return float(f"{x:.12g}")
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        if isinstance(x, list):
            return [rounded(v) for v in x]
        return x

    assert rounded(json.loads(acc.read_text())) == rounded(accuracy.summary_of(acc.parent))


def test_accuracy_reads_the_greedy_result_from_its_file_whatever_else_reaches_stdout(tmp_path, monkeypatch):
    """On the H200 the greedy child exited 0 yet its last stdout line was not the JSON (vLLM logs to stdout),
    and the summary died on it. The child now writes its result to --out; stdout is only shown on failure."""
    from benchmarks import accuracy

    result = {"model_class": "m", "tokens": [[5, 6]]}
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        if "benchmarks.greedy" in cmd:
            out = cmd[cmd.index("--out") + 1]
            if "megakernel" in out:  # this side's child "succeeds" without leaving a result
                return subprocess.CompletedProcess(cmd, 0, "INFO shutting down\n", "")
            Path(out).write_text(json.dumps(result))
            return subprocess.CompletedProcess(cmd, 0, json.dumps({"not": "this"}) + "\nINFO [core.py] exiting\n", "")
        return subprocess.CompletedProcess(cmd, 0)  # lm-eval

    monkeypatch.setattr(accuracy.subprocess, "run", fake_run)
    monkeypatch.setattr(accuracy, "wait_until_released", lambda: None)
    args = argparse.Namespace(model="ckpt", max_tokens=7, out=tmp_path, gpu_memory_utilization=0.5)
    accuracy.run_side("stock", args, tmp_path, {})
    written = json.loads((tmp_path / "greedy-stock.json").read_text())
    assert written == {"settings": {"model": "ckpt", "max_tokens": 7}, **result}
    assert not list(tmp_path.glob("*.raw.json"))  # the child's file is consumed
    (tmp_path / "greedy-megakernel.raw.json").write_text(json.dumps(result))  # an earlier run's leftover
    with pytest.raises(RuntimeError, match="megakernel side's greedy generation failed .*no result file"):
        accuracy.run_side("megakernel", args, tmp_path, {})
    assert not (tmp_path / "greedy-megakernel.json").exists()


def test_summarizing_accuracy_leaves_the_folder_as_it_is(tmp_path, capsys):
    from benchmarks import accuracy

    accuracy.main(["--model", "m", "--out", str(tmp_path), "--sides", ""])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["accuracy.json"]
    assert json.loads(capsys.readouterr().out) == {"lm_eval": {}, "greedy": None}


class _FakeEngine:
    """Steps like vLLM's LLMEngine on a fake clock: prefill steps (``prefill_s`` each) that give the next
    ``per_prefill`` requests their first token, then decode steps that add one token to every request until it
    has ``max_tokens`` and cost ``step_s`` for the whole batch, less as requests finish. With ``mixed`` the
    requests that have their first token also decode in the prefill steps, as vLLM's chunked prefill runs them."""

    def __init__(self, clock, prefill_s, step_s, per_prefill, mixed=False):
        self.clock, self.prefill_s, self.step_s, self.per_prefill = clock, prefill_s, step_s, per_prefill
        self.mixed = mixed
        self.requests: dict[str, int] = {}  # id -> tokens so far
        self.max_tokens = 0
        self.run_size = 0  # the requests of the current run, which a step of the whole batch decodes

    def add_request(self, request_id, prompt, params):
        if not self.has_unfinished_requests():
            self.run_size = 0
        self.requests[request_id] = 0
        self.run_size += 1
        self.max_tokens = params.max_tokens

    def has_unfinished_requests(self):
        return any(n < self.max_tokens for n in self.requests.values())

    def step(self):
        import types

        live = [r for r, n in self.requests.items() if 0 < n < self.max_tokens]
        waiting = [r for r, n in self.requests.items() if n == 0]
        if waiting:
            self.clock.now += self.prefill_s
            batch = waiting[: self.per_prefill] + (live if self.mixed else [])
        else:
            self.clock.now += self.step_s * len(live) / self.run_size
            batch = live
        for r in batch:
            self.requests[r] += 1
        return [types.SimpleNamespace(request_id=r, finished=self.requests[r] == self.max_tokens,
                                      outputs=[types.SimpleNamespace(token_ids=[0] * self.requests[r])])
                for r in batch]


@pytest.mark.parametrize("per_prefill", [4, 2, 1])
def test_decode_interval_holds_the_decode_steps_and_none_of_the_prefill(per_prefill):
    """The sweep's rate: N decode steps after every request has its first token, whatever the prefill
    took (one slow, uncached prefill made the old two-run difference report more than the speed of light)."""
    import types

    from benchmarks.decode_sweep import decode_interval

    clock = types.SimpleNamespace(now=100.0)
    engine = _FakeEngine(clock, prefill_s=3.0, step_s=0.01, per_prefill=per_prefill)
    params = [types.SimpleNamespace(max_tokens=257)] * 4
    run = decode_interval(engine, ["p"] * 4, params, clock=lambda: clock.now)
    prefill_steps = -(-4 // per_prefill)
    # the requests waiting for the others' prefill do not decode here, so all finish on the last step
    assert run.to_first_s == pytest.approx(3.0 * prefill_steps)
    assert (run.steps, run.whole) == (256, True) and run.seconds == pytest.approx(256 * 0.01)
    assert run.per_request_tok_s == pytest.approx(100.0)


def test_decode_interval_leaves_out_the_smaller_batches_after_staggered_prefills():
    """Prompts prefilled one after another (chunked prefill of long prompts) decode while the later ones prefill,
    so they finish first and the run's last steps hold fewer requests, each cheaper: timing to the last request's
    end gave more than the whole batch's rate (session AR, 8 x 128K). The interval ends at the first request's
    end: only steps of the whole batch, the run marked as not whole."""
    import types

    from benchmarks.decode_sweep import decode_interval

    clock = types.SimpleNamespace(now=0.0)
    engine = _FakeEngine(clock, prefill_s=3.0, step_s=0.01, per_prefill=1, mixed=True)
    run = decode_interval(engine, ["p"] * 4, [types.SimpleNamespace(max_tokens=257)] * 4, clock=lambda: clock.now)
    # at the fourth prefill step the first request has 4 tokens: 253 steps of all four follow until it ends
    assert run.to_first_s == pytest.approx(12.0) and (run.steps, run.whole) == (253, False)
    assert run.per_request_tok_s == pytest.approx(100.0)  # one token per request per 0.01-s step of the batch
    tail_rate = 256 / (clock.now - 12.0)  # the old interval: to the last request's end, 3 cheaper steps in it
    assert tail_rate > run.per_request_tok_s


def test_a_run_whose_first_request_finishes_before_the_last_starts_has_no_batch_rate():
    """Prefills spread over more steps than the requests' new tokens: the early requests are done before the last
    one has its first token, so no step decodes the whole batch, and the case says so instead of timing fewer."""
    import types

    from benchmarks.decode_sweep import NoWholeBatch, decode_interval

    clock = types.SimpleNamespace(now=0.0)
    engine = _FakeEngine(clock, prefill_s=3.0, step_s=0.01, per_prefill=1, mixed=True)
    with pytest.raises(NoWholeBatch, match="finished its 5 tokens before 3 of the 8 prompts had their first token"):
        decode_interval(engine, ["p"] * 8, [types.SimpleNamespace(max_tokens=5)] * 8, clock=lambda: clock.now)


def test_the_table_says_when_a_runs_rate_counts_only_the_steps_before_its_first_request_finished(config):
    result = recorded(config)
    assert "prefills ended on different steps" not in report.markdown(result)
    case = next(c for c in result["cases"] if c["side"] == "megakernel" and c["batch"] == 8 and c["context"] == 8192)
    case["timings_s"] = [[40.0, 2.0, 199, False], [40.0, 2.0, 201, False], [0.3, 2.5, 1000, True]]
    assert ("megakernel batch 8 at 8K: in 2 of 3 runs the prefills ended on different steps, so the rate counts "
            "the 199-201 steps of the whole batch before the first request finished, not all 1000.") \
        in report.markdown(result)


_FAKE_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_serve_side_refuses_a_port_another_server_already_answers_on(tmp_path):
    """Session AA: a stray server from a run a time limit stopped answered /health on the port, the side's own
    server died at start-up (no GPU memory left), and the benchmark measured the stray one as that side."""
    import sys

    from benchmarks import serve_load

    port = _free_port()
    stray = subprocess.Popen([sys.executable, "-c", _FAKE_SERVER, str(port)])
    try:
        import time

        deadline = time.time() + 20
        while not serve_load.answers_health(port, timeout=1):
            assert time.time() < deadline and stray.poll() is None
            time.sleep(0.05)
        marker = tmp_path / "started"
        with pytest.raises(serve_load.ServerError, match=f"already holds port {port}"):
            with serve_load.served([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], port,
                                   tmp_path / "server.log", startup_timeout=10):
                pass
        assert not marker.exists()  # refused before starting anything
    finally:
        stray.kill()
        stray.wait()


def test_a_time_limits_sigterm_stops_the_sides_server_even_when_a_second_signal_comes(tmp_path):
    """`timeout` signals the benchmark, then its process group; the server runs in its own session, so only the
    benchmark's handler (exit_cleanly_on_signals, then served's cleanup) can stop it, and the second signal must
    not cut that cleanup short. The fake server ignores SIGTERM, so the cleanup has to wait and then SIGKILL."""
    import contextlib
    import os
    import signal
    import sys
    import time

    from benchmarks import serve_load

    port = _free_port()
    (tmp_path / "fake_server.py").write_text("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                             + _FAKE_SERVER)
    script = (f"import sys, time\nsys.path.insert(0, {str(REPO)!r})\n"
              "from benchmarks import serve_load\nserve_load.exit_cleanly_on_signals()\n"
              f"with serve_load.served([sys.executable, {str(tmp_path / 'fake_server.py')!r}, '{port}'], {port}, "
              f"__import__('pathlib').Path({str(tmp_path / 'server.log')!r}), 30, stop_wait_s=3) as p:\n"
              "    print(p.pid, flush=True)\n    time.sleep(120)\n")
    bench = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    server_pid = None
    try:
        server_pid = int(bench.stdout.readline())
        assert serve_load.answers_health(port, timeout=2)
        bench.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # inside the cleanup's wait for the server, which ignores SIGTERM
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
        assert not serve_load.answers_health(port, timeout=1)
        with pytest.raises(ProcessLookupError):  # killed and reaped by the benchmark before it left
            os.kill(server_pid, 0)
    finally:
        bench.kill()
        bench.wait()
        if server_pid is not None:  # a failed run must not leave the fake server behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server_pid, signal.SIGKILL)


def test_a_signal_the_caller_ignores_stays_ignored_and_the_handlers_can_be_put_back():
    import signal

    from benchmarks import serve_load

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        replaced = serve_load.exit_cleanly_on_signals()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN and set(replaced) == {signal.SIGTERM}
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, before[signal.SIGTERM])
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_serve_side_refuses_a_port_held_by_a_listener_that_does_not_answer(tmp_path):
    """vLLM's server sets SO_REUSEPORT: a second server could bind beside a stray one still starting up (no
    /health answer yet) and share the benchmark's connections with it. The plain bind sees it."""
    import socket
    import sys

    from benchmarks import serve_load

    with socket.socket() as stray:
        stray.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        stray.bind(("127.0.0.1", 0))
        stray.listen()
        port = stray.getsockname()[1]
        with pytest.raises(serve_load.ServerError, match=f"already holds port {port}"):
            with serve_load.served([sys.executable, "-c", "pass"], port, tmp_path / "server.log", startup_timeout=5):
                pass
    assert not serve_load.port_taken(port)


def test_greedy_files_are_read_loose_or_from_a_packed_tar_and_a_tar_without_them_is_an_error(tmp_path):
    """benchmarks.accuracy reads each side's greedy result from greedy-SIDE.json or from greedy.tar.xz (committed
    folders pack them); member names with a leading ./ count, and a tar with none, or a side both loose and packed,
    is an error rather than a summary without greedy agreement."""
    import tarfile

    from benchmarks.accuracy import greedy_files

    stock, mk = {"tokens": [[1]]}, {"tokens": [[2]]}
    (tmp_path / "greedy-stock.json").write_text(json.dumps(stock))
    assert greedy_files(tmp_path) == {"stock": stock}
    packed = tmp_path / "p"
    packed.mkdir()
    (packed / "greedy-megakernel.json").write_text(json.dumps(mk))
    (packed / "greedy-stock.json").write_text(json.dumps(stock))
    with tarfile.open(tmp_path / "greedy.tar.xz", "w:xz") as tar:
        tar.add(packed / "greedy-megakernel.json", arcname="./greedy-megakernel.json")
    assert greedy_files(tmp_path) == {"stock": stock, "megakernel": mk}  # one loose, one packed
    with tarfile.open(tmp_path / "greedy.tar.xz", "w:xz") as tar:
        tar.add(packed / "greedy-stock.json", arcname="greedy-stock.json")
    with pytest.raises(ValueError, match="both loose and in greedy.tar.xz"):
        greedy_files(tmp_path)
    with tarfile.open(tmp_path / "greedy.tar.xz", "w:xz") as tar:
        tar.add(packed / "greedy-stock.json", arcname="other.json")
    with pytest.raises(ValueError, match="holds no greedy-SIDE.json"):
        greedy_files(tmp_path)

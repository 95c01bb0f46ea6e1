"""Tables and plots from a decode-sweep result (results.json), so a recorded run can be re-rendered and
the rendering tested without a GPU; and one result from several runs of one sweep split across GPUs or
device calls:

    python -m benchmarks.report merge --out benchmarks/results/NAME RUN_DIR [RUN_DIR ...]

Result layout (written by benchmarks.decode_sweep):
    {"env": {...}, "bandwidth_bytes_per_s": float, "new_tokens": int, "config": {...model config...},
     "sides": {"megakernel": {"use_megakernel": bool, "decision": str}, "stock": {...}},
     "cases": [{"side", "batch", "context", "status": "ok" | "skipped" | "failed", "reason",
                "per_request_tok_s": [one per repeat], "distinct_experts": float | None,
                "run_distinct_experts": float | None (megakernel cases since session AR)}]}
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from benchmarks import write_json_atomic
from benchmarks.sol import (
    ModelBytes,
    expected_distinct_experts,
    expected_distinct_experts_with_replacement,
    sol_tokens_per_s,
)

SIDES = ("stock", "megakernel")


def summarize(result: dict) -> list[dict]:
    """One row per (batch, context): each side's median aggregate tok/s and spread, ratio, SOL."""
    mb = ModelBytes.from_config(result["config"])
    # with vLLM's uniform routing simulator on both sides, stock draws a token's experts with repeats allowed
    # and the megakernel without (its hash draws distinct ones): each side's % of SOL uses its own expected count
    uniform_both = "both sides" in result.get("env", {}).get("routing_simulation", "off")
    by_key: dict[tuple[int, int], dict] = defaultdict(dict)
    for case in result["cases"]:
        by_key[(case["batch"], case["context"])][case["side"]] = case
    rows = []
    for (batch, context), sides in sorted(by_key.items()):
        row = {"batch": batch, "context": context}
        distinct = [c.get("distinct_experts") for c in sides.values() if c.get("distinct_experts")]
        row["distinct_experts"] = distinct[0] if distinct else None
        # the routing probe's count comes from a short synthetic history; the megakernel's last step of the case
        # routed the run's own (its route buffer's counts), so that one sets the bytes where it was read
        run = [c.get("run_distinct_experts") for c in sides.values() if c.get("run_distinct_experts")]
        row["run_distinct_experts"] = run[0] if run else None
        row["distinct_source"] = "run" if run else "measured" if distinct else "uniform"
        d = row["run_distinct_experts"] or row["distinct_experts"] \
            or expected_distinct_experts(mb.num_experts, mb.top_k, batch)
        row["distinct_used"] = d
        # a merged result keeps each case's own run's bandwidth
        bw = next((c["bandwidth_bytes_per_s"] for c in sides.values() if "bandwidth_bytes_per_s" in c),
                  result["bandwidth_bytes_per_s"])
        row["sol_tok_s"] = sol_tokens_per_s(mb, batch, context, bw, d)
        for side in SIDES:
            case = sides.get(side)
            if case is None or case["status"] != "ok":
                row[side] = None
                row[f"{side}_note"] = case["reason"] if case else "not run"
                continue
            agg = [batch * r for r in case["per_request_tok_s"]]
            row[side] = statistics.median(agg)
            row[f"{side}_spread"] = (min(agg), max(agg))
            sol = row["sol_tok_s"]
            if uniform_both and side == "stock":  # stock's own draws (the probe does not run under the simulator)
                sol = sol_tokens_per_s(mb, batch, context, bw,
                                       expected_distinct_experts_with_replacement(mb.num_experts, mb.top_k, batch))
            row[f"{side}_pct_sol"] = 100.0 * row[side] / sol
        row["ratio"] = row["megakernel"] / row["stock"] if row.get("megakernel") and row.get("stock") else None
        rows.append(row)
    return rows


def tokens_label(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def markdown(result: dict) -> str:
    rows = summarize(result)
    lines = []
    mk = result["sides"].get("megakernel")
    if mk is None:
        lines.append("**Stock vLLM only**: this run had no megakernel side.\n")
    elif not any(c["side"] == "megakernel" and c["status"] == "ok" for c in result["cases"]):
        # an engine stopped (a time limit, a crash) before its first case decided nothing: saying that it ran
        # stock vLLM would misread a run cut short as a fallback
        lines.append(f"**The megakernel side has no numbers** ({mk.get('decision', 'no decision recorded')}): "
                     "no speedup was measured.\n")
    elif not mk.get("use_megakernel", False):
        lines.append(f"**The megakernel side ran stock vLLM** ({mk.get('decision', 'no decision recorded')}): "
                     "its numbers are a second stock measurement, not a speedup.\n")
    env = result.get("env", {})
    if env.get("routing_simulation", "off") != "off":
        if "both sides" in env["routing_simulation"]:
            lines.append(f"**Routing simulated** ({env['routing_simulation']}): the MoE layers route by vLLM's "
                         "routing simulator (uniform, weight 1), not by the weights' router; the megakernel draws "
                         "its experts from a hash instead of torch.randint, distinct within a row where randint "
                         "allows repeats, so it moves slightly more expert bytes per step than stock (about 2% "
                         "more distinct experts at batch 8). The SOL column counts the megakernel's distinct experts; "
                         "stock's % of SOL counts its own, drawn with repeats.\n")
        else:  # runs before the megakernel simulated it
            lines.append(f"**Routing simulated** ({env['routing_simulation']}): the stock side's MoE layers route "
                         "by vLLM's routing simulator, not by the weights' router; the megakernel always routes by "
                         "the weights, so compare the two sides only where the routing matches.\n")
    cached = (" Prompts were prefix-cached by the warm-up, so timed runs recompute only each prompt's last "
              "block." if env.get("prefix_caching") else "")
    changed = changed_env(env)
    if "sampling" in changed:
        cached += f" Tokens sampled at {changed['sampling']}, the same seeds on both sides (not greedy)."
    if "max_model_len" in changed:
        cached += (f" Both engines at max_model_len {changed['max_model_len']}, not fitted to the contexts (vLLM "
                   "copies every step's block-table rows at that width).")
    bws = result.get("run_bandwidths") or [result["bandwidth_bytes_per_s"]]
    measured = (f"{bws[0] / 1e12:.2f} TB/s" if len(bws) == 1 else
                f"{min(bws) / 1e12:.2f}-{max(bws) / 1e12:.2f} TB/s in the {len(bws)} runs merged here, each "
                "case's speed of light using its own run's figure")
    lines.append(f"GPU {env.get('gpu', '?')}, vLLM {env.get('vllm', '?')}, torch {env.get('torch', '?')}, "
                 f"{result['new_tokens']} new tokens per request, median of {env.get('repeats', '?')} runs; "
                 f"HBM bandwidth measured {measured}.{cached}\n")
    starts = {side: sorted({c["engine_init_s"] for c in result["cases"] if c["side"] == side and "engine_init_s" in c})
              for side in SIDES}
    if any(starts.values()):
        lines.append("Engine start-up (LLM() to ready: weights, torch.compile, CUDA graphs): " + "; ".join(
            f"{side} {' / '.join(f'{x:.0f}' for x in v)} s" for side, v in starts.items() if v) + ".\n")
    lines.append("| batch | context | stock tok/s (min-max) | megakernel tok/s (min-max) | ratio | "
                 "distinct experts/layer | SOL tok/s | stock % SOL | megakernel % SOL |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def cell(side):
            if r[side] is None:
                return f"- ({r[f'{side}_note']})"
            lo, hi = r[f"{side}_spread"]
            return f"{r[side]:.0f} ({lo:.0f}-{hi:.0f})"

        def pct(side):
            return f"{r[f'{side}_pct_sol']:.0f}%" if r[side] is not None else "-"

        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
        source = {"measured": "", "run": " (run)", "uniform": " (uniform)"}[r["distinct_source"]]
        dist = f"{r['distinct_used']:.1f}{source}"
        lines.append(f"| {r['batch']} | {tokens_label(r['context'])} | {cell('stock')} | {cell('megakernel')} | "
                     f"{ratio} | {dist} | {r['sol_tok_s']:.0f} | {pct('stock')} | {pct('megakernel')} |")
    if any(r["distinct_source"] == "run" for r in rows):
        lines.append("\n\"(run)\": the distinct experts per MoE layer that the megakernel's last decode step of the "
                     "case routed, which the SOL column counts for both sides (the same weights and prompts; stock's "
                     "own routing, inside its CUDA graphs, is not read)" + "".join(
                         f"; batch {r['batch']}, {tokens_label(r['context'])}: the routing probe's "
                         f"{r['distinct_experts']:.1f}" for r in rows
                         if r["distinct_source"] == "run" and r["distinct_experts"]) + ".")
    for r in rows:
        for side in ("stock", "megakernel"):
            if r[side] is not None and r[f"{side}_pct_sol"] > 100:
                lines.append(f"\n**Above the speed of light, not a valid figure:** {side} at batch {r['batch']}, "
                             f"{tokens_label(r['context'])} ran at {r[f'{side}_pct_sol']:.0f}% of the speed of light, "
                             "so it moved fewer bytes than the model must (the side skipped work, or the count is "
                             "wrong).")
    for c in result["cases"]:  # decode_sweep since session AR: [to first token, seconds, steps, whole] per run
        partial = [run for run in c.get("timings_s") or [] if len(run) == 4 and not run[3]]
        if partial:
            lines.append(f"\n{c['side']} batch {c['batch']} at {tokens_label(c['context'])}: in {len(partial)} of "
                         f"{len(c['timings_s'])} runs the prefills ended on different steps, so the rate counts the "
                         f"{min(r[2] for r in partial)}-{max(r[2] for r in partial)} steps of the whole batch before "
                         f"the first request finished, not all {result['new_tokens']}.")
    for s in result.get("superseded", []):
        lines.append(f"\n{s['side']} batch {s['batch']} at {tokens_label(s['context'])}: one merged run did not "
                     f"finish it ({s['reason']}); the row comes from the run that did.")
    return "\n".join(lines) + "\n"


def _by_batch(rows: list[dict], value) -> list[tuple[str, str, list]]:
    """(label, line style, points) per (context, side): value(row, side) against batch size."""
    series = []
    for ctx in sorted({r["context"] for r in rows}):
        rs = [r for r in rows if r["context"] == ctx]
        for side, style in (("stock", "--"), ("megakernel", "-")):
            series.append((f"{side} {tokens_label(ctx)}", style, [(r["batch"], value(r, side)) for r in rs if r[side]]))
    return series


def _line_plot(path: Path, series, xlabel: str, ylabel: str, title: str, hline: float | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, style, pts in series:
        if pts:
            ax.plot(*zip(*pts), style, marker="o", label=label)
    if hline is not None:
        ax.axhline(hline, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plots(result: dict, out_dir: Path) -> list[Path]:
    rows = summarize(result)
    out_dir.mkdir(parents=True, exist_ok=True)
    speedup = [(f"batch {b}", "-", [(r["context"], r["ratio"]) for r in rows if r["batch"] == b and r["ratio"]])
               for b in sorted({r["batch"] for r in rows})]
    paths = [_line_plot(out_dir / "toks_vs_batch.png", _by_batch(rows, lambda r, side: r[side]),
                        "batch size", "decode tok/s (aggregate)", "Decode throughput")]
    if any(pts for _, _, pts in speedup):  # a stock-only run has no ratios to plot
        paths.append(_line_plot(out_dir / "speedup_vs_context.png", speedup, "context (tokens)",
                                "megakernel / stock", "Speedup vs context", hline=1.0))
    paths.append(_line_plot(out_dir / "pct_sol.png", _by_batch(rows, lambda r, side: r[f"{side}_pct_sol"]),
                            "batch size", "% of memory speed of light", "Fraction of SOL"))
    return paths


# What runs of one sweep must share to be merged (everything that changes the numbers but the cases).
MERGE_MUST_MATCH = ("new_tokens", "config")
ENV_MUST_MATCH = ("gpu", "vllm", "torch", "repeats", "load_format", "model", "graph_mode", "routing_simulation",
                  "prefix_caching", "sampling", "max_model_len")
# what a run recorded before its env had the key ran as
ENV_DEFAULTS = {"sampling": "greedy", "max_model_len": "fitted"}


def env_value(env: dict, key: str):
    """A recorded env setting, or for a run recorded before the key what it ran as (ENV_DEFAULTS)."""
    return env.get(key, ENV_DEFAULTS.get(key))


def changed_env(env: dict) -> dict:
    """The run's settings among ENV_DEFAULTS' keys that are not their default, which the table and the headline
    name (a greedy run at a fitted max_model_len names none)."""
    values = {k: env_value(env, k) for k in ENV_DEFAULTS}
    return {k: v for k, v in values.items() if v != ENV_DEFAULTS[k]}


def merge(results: list[dict]) -> dict:
    """One result from several runs of the same sweep (e.g. 1K-8K contexts on one GPU, 32K on another).
    Each case keeps the bandwidth its own run measured; runs that differ in settings, disagree on a side's
    decision, or finished the same case twice are refused. A case one run did not finish (status failed:
    its engine was stopped or died first) yields to the same case finished by another run, so a case cut
    off by a time limit can be re-run on its own and merged in; the result lists what was superseded, and
    its table says so. A side's decision comes from the runs where that side finished a case: a run
    stopped before its side finished anything only knows that the engine stopped."""
    if not results:
        raise ValueError("nothing to merge")
    first = results[0]
    for r in results[1:]:
        for key in MERGE_MUST_MATCH:
            if r[key] != first[key]:
                raise ValueError(f"runs differ in {key}: cannot merge")
        for key in ENV_MUST_MATCH:
            theirs, ours = (env_value(x["env"], key) for x in (r, first))
            if theirs != ours:
                raise ValueError(f"runs differ in env.{key}: {ours!r} vs {theirs!r}")
    sides: dict = {}
    for r in results:
        for side, info in r["sides"].items():
            if not any(c["side"] == side and c["status"] != "failed" for c in r["cases"]):
                continue
            if sides.setdefault(side, info)["use_megakernel"] != info["use_megakernel"]:
                raise ValueError(f"the {side} side ran the megakernel in one run and not in another")
    for r in results:  # a side no run finished a case of keeps the first run's account of why
        for side, info in r["sides"].items():
            sides.setdefault(side, info)
    by_key: dict = {}
    unfinished = [s for r in results for s in r.get("superseded", [])]  # a part may itself be a merge
    for r in results:
        for c in r["cases"]:
            key = (c["side"], c["batch"], c["context"])
            case = {**c, "bandwidth_bytes_per_s": c.get("bandwidth_bytes_per_s", r["bandwidth_bytes_per_s"])}
            held = by_key.get(key)
            if held is not None and held["status"] != "failed" and case["status"] != "failed":
                raise ValueError(f"case {key} was finished in more than one run")
            if case["status"] == "failed":
                unfinished.append({k: case[k] for k in ("side", "batch", "context", "reason")})
            if held is None or held["status"] == "failed":
                by_key[key] = case
    cases = list(by_key.values())
    # superseded: the unfinished copies of cases another run finished (a case no run finished is its row),
    # each once however many merged parts carry it
    once = {(s["context"], s["batch"], s["side"], s["reason"]): s for s in unfinished
            if by_key[(s["side"], s["batch"], s["context"])]["status"] != "failed"}
    superseded = [once[k] for k in sorted(once)]
    run_bws = [bw for r in results for bw in (r.get("run_bandwidths") or [r["bandwidth_bytes_per_s"]])]
    return {**first, "bandwidth_bytes_per_s": min(run_bws), "run_bandwidths": run_bws, "sides": sides,
            "superseded": superseded,
            "cases": sorted(cases, key=lambda c: (c["context"], c["batch"], c["side"])),
            # a part may itself be a merge: its bandwidths and commands are lists already
            "command": [c for r in results
                        for c in (r["command"] if isinstance(r["command"], list) else [r["command"]])]}


def write(result: dict, out_dir: Path) -> str:
    """results.json, table.md and the plots of a result in out_dir; returns the table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "results.json", result, indent=1)
    table = markdown(result)
    (out_dir / "table.md").write_text(table)
    plots(result, out_dir)
    return table


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="merge decode-sweep runs into one result, table and plots")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("runs", type=Path, nargs="+", help="run folders (or their results.json)")
    args = ap.parse_args(argv)
    runs = [json.loads((p / "results.json" if p.is_dir() else p).read_text()) for p in args.runs]
    print(write(merge(runs), args.out))


if __name__ == "__main__":
    main()

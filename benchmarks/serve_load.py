"""Serving load: `vllm serve` with the megakernel on, then off, driven by `vllm bench serve`.

    python -m benchmarks.serve_load --model configs/north-mini-code --load-format dummy \\
        --concurrency 1,8,32,64 --out benchmarks/results/NAME-serve

Per side: start the OpenAI server (loopback only), wait for /health, read the KV-cache capacity it logs,
run `vllm bench serve` (random prompts, --ignore-eos, an unmeasured warm-up wave) at each concurrency while
sampling the GPU's memory use, stop the server. Each side leaves side-SIDE.json in --out; serve.json and
serve.md (output tok/s, median TPOT and TTFT, peak GPU memory and KV-cache capacity) cover every side --out
holds. So on a host with two GPUs the sides can run at once, one per GPU, each on its own port:

    CUDA_VISIBLE_DEVICES=0 python -m benchmarks.serve_load ... --out O --sides stock --port 8199 &
    CUDA_VISIBLE_DEVICES=1 python -m benchmarks.serve_load ... --out O --sides megakernel --port 8200; wait
    python -m benchmarks.serve_load --model M --out O --sides ""        # only (re)writes serve.json/.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from benchmarks import SIDE_CONFIG, check_same_settings, parse_sides, write_json_atomic
from benchmarks.gpu_memory import used_and_total_mib, wait_until_released

KV_LINE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
DECISION_LINE = re.compile(r"(vllm_megakernel: decode runs on .*)")


def parse_server_log(text: str) -> dict:
    kv = KV_LINE.findall(text)
    decision = DECISION_LINE.findall(text)
    return {"kv_cache_tokens": int(kv[-1].replace(",", "")) if kv else None,
            "decision": decision[-1].strip() if decision else None}


def side_mismatch(side: str, decision: str | None) -> str | None:
    """Why the server's own decision line says it did not serve as ``side`` (None when it did): the megakernel
    side must run decode on the megakernel, the stock side on stock vLLM. A missing line means the numbers did
    not come from this side's server (session AA: a stray server answered) or the plugin did not load."""
    if decision is None:
        return "the side's server logged no megakernel decision (plugin not loaded, or another server answered)"
    on_megakernel = "decode runs on the megakernel" in decision
    if on_megakernel != (side == "megakernel"):
        return f"the {side} side's server did not run as {side}: {decision}"
    return None


def bench_row(result: dict) -> dict:
    """The numbers we report from one `vllm bench serve --save-result` JSON."""
    return {
        "concurrency": result.get("max_concurrency"),
        "completed": result["completed"],
        "failed": result.get("failed", 0),
        "output_tok_s": result["output_throughput"],
        "median_tpot_ms": result["median_tpot_ms"],
        "median_ttft_ms": result["median_ttft_ms"],
        "p99_tpot_ms": result.get("p99_tpot_ms"),
    }


def markdown(summary: dict) -> str:
    lines = ["| side | concurrency | requests ok / failed | output tok/s | median TPOT ms | median TTFT ms | "
             "peak GPU GiB | KV cache tokens |",
             "|---|---|---|---|---|---|---|---|"]
    for side, s in summary["sides"].items():
        peak = "-" if s.get("peak_gpu_gib") is None else f"{s['peak_gpu_gib']:.1f}"
        for row in s.get("rows", []):
            lines.append(f"| {side} | {row['concurrency']} | {row['completed']} / {row['failed']} | "
                         f"{row['output_tok_s']:.0f} | {row['median_tpot_ms']:.2f} | {row['median_ttft_ms']:.1f} | "
                         f"{peak} | {s.get('kv_cache_tokens')} |")
    notes = [f"- {side}: " + "; ".join(x for x in (server_size(s), s.get("decision"), s.get("error")) if x)
             for side, s in summary["sides"].items()]
    return "\n".join(lines + [""] + notes + comparison(summary)) + "\n"


def server_seqs(settings: dict | None) -> int | None:
    """The server's --max-num-seqs: as recorded, or (side files from before it was) the largest level, which
    run_side used then."""
    settings = settings or {}
    levels = settings.get("concurrency")
    return settings.get("max_num_seqs") or (max(levels) if levels else None)


def server_size(side: dict) -> str | None:
    """The server's size for the table's notes, beside its KV cache tokens: --max-num-seqs sets its CUDA-graph
    capture sizes, and so its KV cache too."""
    seqs = server_seqs(side.get("settings"))
    return None if seqs is None else f"max_num_seqs {seqs}"


def comparison(summary: dict) -> list[str]:
    """The megakernel against stock at each concurrency both sides measured (issue #12 reads TPOT and output tok/s
    as ratios); nothing when a side is missing. A level where either side had failed requests or no figure gets
    no ratio, and servers of different sizes are said to be so under the table."""
    sides = summary["sides"]
    if not {"stock", "megakernel"} <= set(sides):
        return []
    by_level = {side: {row["concurrency"]: row for row in sides[side].get("rows", [])} for side in sides}
    levels = sorted(set(by_level["stock"]) & set(by_level["megakernel"]))
    if not levels:
        return []

    def ratio(mk: float, st: float, ok: bool) -> str:
        return f"{mk / st:.2f}x" if ok and st > 0 and mk > 0 else "-"

    lines = ["", "| concurrency | output tok/s stock / megakernel | ratio | median TPOT ms stock / megakernel | "
             "TPOT ratio |", "|---|---|---|---|---|"]
    for c in levels:
        st, mk = by_level["stock"][c], by_level["megakernel"][c]
        ok = st["failed"] == 0 and mk["failed"] == 0
        lines.append(f"| {c} | {st['output_tok_s']:.0f} / {mk['output_tok_s']:.0f} | "
                     f"{ratio(mk['output_tok_s'], st['output_tok_s'], ok)} | {st['median_tpot_ms']:.2f} / "
                     f"{mk['median_tpot_ms']:.2f} | {ratio(mk['median_tpot_ms'], st['median_tpot_ms'], ok)} |")
    seqs = {side: server_seqs(sides[side].get("settings")) for side in ("stock", "megakernel")}
    if seqs["stock"] != seqs["megakernel"]:
        lines += ["", f"The servers differ in size: max_num_seqs {seqs['stock']} (stock) and {seqs['megakernel']} "
                      "(megakernel), so their CUDA-graph capture sizes and KV caches differ too."]
    return lines


class ServerError(RuntimeError):
    pass


def answers_health(port: int, timeout: float = 5) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def port_taken(port: int) -> bool:
    """Whether something holds the loopback port. A plain bind, without SO_REUSEPORT: vLLM's server sets that
    option on its own socket, so a second server could bind the port beside a stray one (still starting up,
    or too slow for /health) and the benchmark's connections would be shared between the two."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR lets the probe past connections of a server that has gone (TIME_WAIT), never past a
        # socket that still listens
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def exit_cleanly_on_signals() -> dict:
    """SIGTERM and SIGHUP (a time limit's `timeout`, a closed session) end the run through SystemExit, so that
    :func:`served` stops its server. The server runs in its own session, outside the group such a signal
    reaches, and Python's default handling of SIGTERM runs no ``finally``: in session AA a stock server
    outlived the run a time limit stopped, and the next runs' servers, refused the GPU's memory, exited while
    their benchmarks measured the stray server on the same port. The first signal turns both into ignored
    ones, so that a second (`timeout` signals the child, then its group) cannot cut the cleanup short; a
    signal the caller ignores (`nohup`) stays ignored. Returns the handlers it replaced."""
    def leave(signum, frame):
        for sig in replaced:
            signal.signal(sig, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    replaced = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) != signal.SIG_IGN:
            replaced[sig] = signal.signal(sig, leave)
    return replaced


@contextlib.contextmanager
def served(cmd: list[str], port: int, log_path: Path, startup_timeout: float, stop_wait_s: float = 15):
    """Runs a `vllm serve` command (its own process group, output to log_path) until /health answers;
    yields the process and stops the whole group on exit (SIGTERM, up to ``stop_wait_s`` to go, then
    SIGKILL). Raises ServerError with the log's tail. Refuses a port something already holds: /health would
    come from that server, and the numbers with it."""
    if port_taken(port) or answers_health(port, timeout=2):
        raise ServerError(f"a server already holds port {port} (one an earlier run left behind?); "
                          "stop it or choose another --port: its answers would be measured as this side's")
    proc = None
    with open(log_path, "w") as log:
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.time() + startup_timeout
            while True:
                healthy = answers_health(port)
                # checked after the answer: a server that answered as it died leaves nothing to measure
                if proc.poll() is not None:
                    raise ServerError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-6000:]}")
                if healthy:
                    break
                if time.time() > deadline:
                    raise ServerError(f"not healthy after {startup_timeout} s:\n{log_path.read_text()[-6000:]}")
                time.sleep(2)
            yield proc
        finally:
            if proc is not None:
                # The group may already be gone (the server died at start-up): nothing left to stop then.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=stop_wait_s)
                # Whatever of the group outlived the server (an engine process) would hold the GPU's memory
                # against the next side's server.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


class GpuMemorySampler(threading.Thread):
    """Peak memory.used (MiB) of the GPU the server runs on, while it runs."""

    def __init__(self, period_s: float = 0.5):
        super().__init__(daemon=True)
        # not `_stop`: threading.Thread has a method of that name, which join() calls
        self.period_s, self.peak_mib, self._halt = period_s, None, threading.Event()

    @property
    def peak_gib(self) -> float | None:
        """None when no read succeeded (no nvidia-smi, or it refused the device): unknown, not zero."""
        return None if self.peak_mib is None else self.peak_mib / 1024

    def run(self):
        while not self._halt.is_set():
            try:
                self.peak_mib = max(self.peak_mib or 0, used_and_total_mib()[0])
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            self._halt.wait(self.period_s)

    def stop(self):
        self._halt.set()
        self.join()


def bench_command(args, concurrency: int, out_dir: Path, name: str) -> list[str]:
    """`vllm bench serve` at one concurrency. Its warm-up wave (as many requests as the concurrency, sent
    at once and not measured) is there to take each level's first-time costs, such as Triton compiling the
    MoE kernel for a new token count, out of the measured requests. Without it, an H200 run measured a
    median TTFT of 1.6-1.8 s at concurrency 8 against 0.5 s at 32 on both sides, and both servers logged
    Triton compiling fused_moe_kernel during inference within their concurrency-8 wave."""
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
            "--backend", "vllm", "--host", "127.0.0.1", "--port", str(args.port),
            "--model", "nmc", "--tokenizer", args.model, "--dataset-name", "random",
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--num-prompts", str(max(args.prompts_per_concurrency * concurrency, 8)),
            "--max-concurrency", str(concurrency), "--num-warmups", str(concurrency),
            "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl",
            "--save-result", "--save-detailed", "--result-dir", str(out_dir), "--result-filename", name]


def drop_generated_texts(path: Path) -> dict:
    """A `--save-detailed` result keeps every request's TTFT, inter-token latencies and start time (to read a
    side's TTFT request by request) and its generated text, which is dropped here: random tokens, ~1 KB a
    request in a committed folder."""
    result = json.loads(path.read_text())
    result.pop("generated_texts", None)
    write_json_atomic(path, result)
    return result


def run_side(side: str, args, out_dir: Path, save=lambda partial: None) -> dict:
    """One side: its server, then each concurrency level. ``save`` gets the side's result so far after every
    level, marked as stopped before the next one, so that a run a time limit kills keeps what it measured
    (session X lost the megakernel side's table that way: its levels' bench files were there, its side file
    was not)."""
    log_path = out_dir / f"server-{side}.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", args.model, "--served-model-name", "nmc",
           "--host", "127.0.0.1", "--port", str(args.port), "--load-format", args.load_format,
           "--additional-config", json.dumps(SIDE_CONFIG[side]), "--max-num-seqs", str(max_num_seqs_of(args)),
           "--no-enable-prefix-caching"]
    wait_until_released()  # the previous side's server may still be letting go of its memory
    sampler = GpuMemorySampler()
    sampler.start()
    rows = []

    def result(**extra) -> dict:
        """The side's result so far, with what its own server logged; a side whose server did not run as that
        side says so whatever else stopped it."""
        log = parse_server_log(log_path.read_text()) if log_path.exists() else parse_server_log("")
        out = {"rows": list(rows), "peak_gpu_gib": sampler.peak_gib, **log, **extra}
        mismatch = side_mismatch(side, log["decision"]) if rows else None
        if mismatch:
            out["error"] = "; ".join(x for x in (out.get("error"), mismatch) if x)
        return out

    try:
        with served(cmd, args.port, log_path, args.startup_timeout) as server:
            for c in args.concurrency:
                name = f"bench-{side}-c{c}.json"
                subprocess.run(bench_command(args, c, out_dir, name), check=True)
                if server.poll() is not None:  # then whatever answered was not this side's server
                    raise ServerError(f"server exited with {server.returncode} during concurrency {c}")
                rows.append(bench_row(drop_generated_texts(out_dir / name)))
                left = args.concurrency[len(rows):]
                if left:
                    save(result(error=f"stopped before concurrency {left[0]} (the run ended there: a time "
                                      "limit or a crash)"))
                print(f"[{side}] concurrency {c}: {rows[-1]['output_tok_s']:.0f} output tok/s", flush=True)
    except ServerError as e:  # the levels measured before it (each checked that the server still ran) stand
        return result(error=f"{e}".splitlines()[0] + f"; see {log_path}")
    except subprocess.CalledProcessError as e:  # keep the levels already measured
        return result(error=f"vllm bench serve failed (exit {e.returncode}) at concurrency "
                            f"{args.concurrency[len(rows)]}")
    finally:
        sampler.stop()
    return result()


SETTINGS = ("model", "load_format", "concurrency", "input_len", "output_len", "prompts_per_concurrency")


def settings_of(args) -> dict:
    """What must be equal for two sides' numbers to be comparable (a side measured before the warm-up wave
    existed has no warmup_wave, so it is not tabled next to one measured after), and the server's size."""
    return {**{k: getattr(args, k) for k in SETTINGS}, "warmup_wave": True, "max_num_seqs": max_num_seqs_of(args)}


def max_num_seqs_of(args) -> int:
    """--max-num-seqs as given, else the largest level. Give it when the sides run apart with different levels
    (one call given less time), so that both servers have one size."""
    seqs = getattr(args, "max_num_seqs", None) or max(args.concurrency)
    if seqs < max(args.concurrency):
        raise ValueError(f"--max-num-seqs {seqs} is below the largest concurrency {max(args.concurrency)}")
    return seqs


def summary_of(out: Path) -> dict:
    """Every side whose side-SIDE.json is in out, stock first; sides measured with different settings (say,
    an old file left in out) are refused rather than tabled side by side."""
    sides = {side: json.loads((out / f"side-{side}.json").read_text())
             for side in ("stock", "megakernel") if (out / f"side-{side}.json").exists()}
    # A level's figures depend on the levels run before it on the same server (its warm code: Triton compiles, the
    # allocator's state), not on those after it. So one side may have run fewer levels (a call given less time) as
    # long as its list is the start of the other's; each row names its concurrency and the comparison takes the
    # levels both have. The servers' sizes (max_num_seqs) may differ then; the comparison says so.
    settings = {side: s.get("settings") for side, s in sides.items()}
    loose = ("concurrency", "max_num_seqs")
    check_same_settings({side: None if st is None else {k: v for k, v in st.items() if k not in loose}
                         for side, st in settings.items()}, f"the sides in {out}")
    if len(sides) == 2 and all(st is not None for st in settings.values()):
        levels = sorted((list(st.get("concurrency") or []) for st in settings.values()), key=len)
        if not levels[0] or levels[1][:len(levels[0])] != levels[0]:
            raise ValueError(f"the sides in {out} used different settings: concurrency {levels[0]} is not the "
                             f"start of {levels[1]}")
    return {"sides": sides}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--prompts-per-concurrency", type=int, default=4)
    ap.add_argument("--max-num-seqs", type=int, default=None,
                    help="the servers' --max-num-seqs (default: the largest concurrency); give the same on both "
                         "sides when they run apart with different levels")
    ap.add_argument("--sides", default="stock,megakernel")
    ap.add_argument("--port", type=int, default=8199)
    ap.add_argument("--startup-timeout", type=int, default=900)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/latest-serve"))
    args = ap.parse_args(argv)
    sides = parse_sides(ap, args.sides)
    if sides:
        try:
            max_num_seqs_of(args)
        except ValueError as e:
            ap.error(str(e))
    command = " ".join([sys.executable, "-m", "benchmarks.serve_load"] + (argv or sys.argv[1:]))
    replaced = exit_cleanly_on_signals()
    try:
        run_sides(args, sides, command)
    finally:
        for sig, handler in replaced.items():
            signal.signal(sig, handler)


def run_sides(args, sides: list[str], command: str) -> None:
    """Each side in turn (its side file after every level), then serve.json and serve.md over --out."""
    args.out.mkdir(parents=True, exist_ok=True)
    for side in sides:
        def save(partial, side=side):
            write_json_atomic(args.out / f"side-{side}.json",
                              {"command": command, "settings": settings_of(args), **partial}, indent=1)

        save(run_side(side, args, args.out, save))
    try:
        summary = summary_of(args.out)
    except ValueError as e:
        sys.exit(f"serve_load: {e}")
    (args.out / "serve.json").write_text(json.dumps(summary, indent=1))
    table = markdown(summary)
    (args.out / "serve.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()

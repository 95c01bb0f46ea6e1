"""Accuracy, megakernel on vs off, on the same weights (use a realistic random checkpoint, not dummy):

1. lm-eval 0.4.13 through its vLLM backend on the local tasks in benchmarks/tasks (no downloads), once per
   side, the switch passed in model_args' additional_config. Scores on random weights say little, and
   nmc_mc's loglikelihoods come from prefill (stock code on both sides), so the generation task's answers
   are also compared item by item: on how many items the two sides generated the very same text;
2. greedy generation of --max-tokens tokens per prompt on both sides: first-divergence position, and over the
   decode steps before it the share of top-20 tokens both sides list and their largest logprob difference
   (benchmarks.agreement says why not a cosine).

    python -m benchmarks.accuracy --model /models/nmc-5l --out benchmarks/results/NAME-accuracy

Each side leaves lm_eval-SIDE/ and greedy-SIDE.json in --out; accuracy.json compares whatever sides --out
holds. So on a host with two GPUs the sides can run at once, one per GPU, into the same --out:

    CUDA_VISIBLE_DEVICES=0 python -m benchmarks.accuracy --model M --out O --sides stock &
    CUDA_VISIBLE_DEVICES=1 python -m benchmarks.accuracy --model M --out O --sides megakernel; wait
    python -m benchmarks.accuracy --model M --out O --sides ""        # only (re)writes accuracy.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import SIDE_CONFIG, check_same_settings, parse_sides, write_json_atomic, write_text_atomic
from benchmarks.agreement import summarize
from benchmarks.gpu_memory import wait_until_released

TASKS = Path(__file__).parent / "tasks"


def materialize_tasks(dest: Path) -> Path:
    """Copies the task YAMLs with __TASK_DIR__ resolved to the data's absolute folder."""
    dest.mkdir(parents=True, exist_ok=True)
    for y in TASKS.glob("*.yaml"):
        # sides running at once into one --out never read a half-written file
        write_text_atomic(dest / y.name, y.read_text().replace("__TASK_DIR__", str(TASKS.resolve())))
    return dest


def lm_eval_cmd(model_args: dict | str, model: str, tasks_dir: Path, out: Path, limit: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "lm_eval", "--model", model,
           "--tasks", "nmc_mc,nmc_gen", "--include_path", str(tasks_dir), "--output_path", str(out)]
    if model_args:
        cmd += ["--model_args", model_args if isinstance(model_args, str) else json.dumps(model_args)]
    if limit:
        cmd += ["--limit", str(limit)]
    return cmd + ["--log_samples"]  # each item's generated text, for generation_agreement


def read_lm_eval_results(out: Path) -> dict:
    files = sorted(out.rglob("results_*.json"))
    if not files:
        raise FileNotFoundError(f"no lm-eval results under {out}")
    res = json.loads(files[-1].read_text())["results"]
    return {task: {k.split(",")[0]: v for k, v in metrics.items() if k.split(",")[0] in ("acc", "exact_match")}
            for task, metrics in res.items()}


def generations(out: Path, task: str = "nmc_gen") -> dict[int, str]:
    """doc_id -> the text lm-eval's --log_samples recorded as generated for that item (newest run)."""
    files = sorted(out.rglob(f"samples_{task}_*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no lm-eval samples of {task} under {out}")
    rows = (json.loads(line) for line in files[-1].read_text().splitlines() if line.strip())
    return {r["doc_id"]: r["resps"][0][0] for r in rows}


def generation_agreement(a: dict[int, str], b: dict[int, str]) -> dict:
    """Items both sides answered, and on how many their generated texts are identical."""
    common = sorted(set(a) & set(b))
    differ = [i for i in common if a[i] != b[i]]
    return {"items": len(common), "identical": len(common) - len(differ), "differing_doc_ids": differ}


def run_side(side: str, args, tasks_dir: Path, env: dict) -> None:
    model_args = {"pretrained": args.model, "dtype": "bfloat16", "max_model_len": 4096,
                  "gpu_memory_utilization": args.gpu_memory_utilization, "additional_config": SIDE_CONFIG[side]}
    wait_until_released()  # the previous engine of this run may still be letting go of its memory
    subprocess.run(lm_eval_cmd(model_args, "vllm", tasks_dir, args.out / f"lm_eval-{side}"), check=True, env=env)
    wait_until_released()
    raw = args.out / f"greedy-{side}.raw.json"
    raw.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.greedy", args.model, json.dumps(SIDE_CONFIG[side]),
                           "--max-tokens", str(args.max_tokens), "--logprobs", "20", "--out", str(raw)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0 or not raw.exists():
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise RuntimeError(f"the {side} side's greedy generation failed (exit {proc.returncode}"
                           f"{'' if raw.exists() else ', no result file'}); its output is above")
    write_json_atomic(args.out / f"greedy-{side}.json",
                      {"settings": {"model": args.model, "max_tokens": args.max_tokens}, **json.loads(raw.read_text())})
    raw.unlink()


def greedy_files(out: Path) -> dict[str, dict]:
    """Each side's greedy result in out: greedy-SIDE.json, or inside greedy.tar.xz where a committed folder packs
    them (they are ~0.6 MB each, and the tree travels to the GPU host with every device call)."""
    found = {side: json.loads((out / f"greedy-{side}.json").read_text())
             for side in SIDE_CONFIG if (out / f"greedy-{side}.json").exists()}
    packed = out / "greedy.tar.xz"
    if packed.exists():
        import tarfile

        with tarfile.open(packed) as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}  # "./greedy-x.json" too
            in_tar = {side: members[f"greedy-{side}.json"] for side in SIDE_CONFIG if f"greedy-{side}.json" in members}
            if not in_tar:
                raise ValueError(f"{packed} holds no greedy-SIDE.json")
            for side, m in in_tar.items():
                if side in found:
                    raise ValueError(f"{out} has greedy-{side}.json both loose and in {packed.name}")
                found[side] = json.load(tar.extractfile(m))
    return found


def summary_of(out: Path) -> dict:
    """lm-eval scores of every side found in out, and the greedy agreement once both sides are there."""
    summary: dict = {"lm_eval": {}, "greedy": None}
    for side in SIDE_CONFIG:
        if (out / f"lm_eval-{side}").is_dir():
            summary["lm_eval"][side] = read_lm_eval_results(out / f"lm_eval-{side}")
    if len(summary["lm_eval"]) == 2:
        try:
            summary["nmc_gen_agreement"] = generation_agreement(generations(out / "lm_eval-stock"),
                                                                generations(out / "lm_eval-megakernel"))
        except FileNotFoundError as e:  # lm-eval only warns when it cannot save samples; keep the rest
            summary["nmc_gen_agreement"] = {"error": str(e)}
    greedy = greedy_files(out)
    check_same_settings({side: g.get("settings") for side, g in greedy.items()}, f"the greedy runs in {out}")
    if len(greedy) == 2:
        summary["greedy"] = summarize(greedy["stock"], greedy["megakernel"])
        summary["model_class"] = {side: g.get("model_class") for side, g in greedy.items()}
    return summary


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/latest-accuracy"))
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    ap.add_argument("--sides", default="stock,megakernel", help="comma-separated; empty: only summarize --out")
    args = ap.parse_args(argv)
    sides = parse_sides(ap, args.sides)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if sides:  # summarizing alone leaves the folder as it is
        tasks_dir = materialize_tasks(args.out / "tasks")
        for side in sides:
            run_side(side, args, tasks_dir, env)
    try:
        summary = summary_of(args.out)
    except ValueError as e:
        sys.exit(f"accuracy: {e}")
    write_json_atomic(args.out / "accuracy.json", summary, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

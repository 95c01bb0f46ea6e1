"""Writes the local lm-eval task data (no downloads): small arithmetic and code-reading items whose answers
are computed here, so they are right by construction.

    python benchmarks/tasks/make_tasks.py     # rewrites nmc_mc.jsonl and nmc_gen.jsonl beside this file
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent


def main(n: int = 60, seed: int = 0) -> None:
    rng = random.Random(seed)
    mc, gen = [], []
    for _ in range(n):
        a, b = rng.randrange(2, 60), rng.randrange(2, 60)
        op = rng.choice(["+", "-", "*"])
        answer = eval(f"{a}{op}{b}")  # noqa: S307  (our own two integers and operator)
        wrong = sorted({answer + d for d in rng.sample([-11, -2, -1, 1, 2, 3, 10], 3)})
        choices = [str(x) for x in sorted(wrong + [answer])]
        mc.append({"question": f"What does the Python expression {a} {op} {b} evaluate to?",
                   "choices": choices, "label": choices.index(str(answer))})
        gen.append({"question": f">>> print({a} {op} {b})", "answer": str(answer)})
    (HERE / "nmc_mc.jsonl").write_text("".join(json.dumps(x) + "\n" for x in mc))
    (HERE / "nmc_gen.jsonl").write_text("".join(json.dumps(x) + "\n" for x in gen))


if __name__ == "__main__":
    main()

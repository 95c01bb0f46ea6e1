"""Agreement of two greedy generations (megakernel vs stock) on the same prompts and weights."""

from __future__ import annotations

import math


def first_divergence(a: list[int], b: list[int]) -> int:
    """Index of the first differing token (the common length when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def topk_logprob_cosine(a: dict[str, float], b: dict[str, float]) -> float:
    """Cosine between two steps' top-k logprob vectors over the union of their tokens; a token missing on
    one side gets that side's smallest logprob (an upper bound on its true value). A stand-in for the
    full-logit cosine, which vLLM does not return."""
    keys = sorted(set(a) | set(b))
    fa, fb = min(a.values()), min(b.values())
    va = [a.get(k, fa) for k in keys]
    vb = [b.get(k, fb) for k in keys]
    dot = sum(x * y for x, y in zip(va, vb))
    na, nb = math.sqrt(sum(x * x for x in va)), math.sqrt(sum(y * y for y in vb))
    return dot / (na * nb) if na and nb else 1.0


def summarize(stock: dict, mk: dict) -> dict:
    """Per prompt: first divergence; over the steps before it (same prefix on both sides): mean and min
    top-k logprob cosine."""
    out = {"first_divergence": [], "mean_cosine": [], "min_cosine": []}
    for i, (ta, tb) in enumerate(zip(stock["tokens"], mk["tokens"])):
        div = first_divergence(ta, tb)
        out["first_divergence"].append(div)
        if "logprobs" in stock and "logprobs" in mk:
            cos = [topk_logprob_cosine(x, y) for x, y in zip(stock["logprobs"][i][: div + 1],
                                                              mk["logprobs"][i][: div + 1])]
            out["mean_cosine"].append(sum(cos) / len(cos) if cos else None)
            out["min_cosine"].append(min(cos) if cos else None)
    return out

"""Agreement of two greedy generations (megakernel vs stock) on the same prompts and weights.

vLLM returns each step's top-k logprobs, not its logits. On the random checkpoints the tests use, a step's
top-20 logprobs lie within about one nat of each other around -9, so a cosine of two such vectors is close to 1
for any two steps, related or not (session Y measured 0.9987-0.9998 over 192 pairs of stock's own steps 0-15
of different prompts, which share no top-20 token): it was dropped. What separates agreement from coincidence is which
tokens make the top k and what each side gives them: per decode step before the first divergence, the share
of the top-k tokens both sides list (unrelated steps: 0 of 20) and the largest logprob difference over those
shared tokens (bf16 agreement: a few hundredths of a nat). Step 0 is the prefill's token, vLLM's own forward on
both sides, so only the decode steps after it say anything about the megakernel.
"""

from __future__ import annotations

import statistics


def first_divergence(a: list[int], b: list[int]) -> int:
    """Index of the first differing token (the common length when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def top_overlap(a: dict[str, float], b: dict[str, float]) -> float:
    """The share of the top-k tokens that both steps list (1: the same set; 0: none in common)."""
    return len(set(a) & set(b)) / max(len(a), len(b))


def max_logprob_diff(a: dict[str, float], b: dict[str, float]) -> float | None:
    """The largest |logprob difference| over the tokens both steps list; None when they share none."""
    shared = set(a) & set(b)
    return max(abs(a[t] - b[t]) for t in shared) if shared else None


def summarize(stock: dict, mk: dict) -> dict:
    """Per prompt: the first divergence and, over the decode steps before it (steps 1 .. divergence - 1: the
    same context on both sides and the same token chosen), how many there are, the median and least top-k
    overlap, and the median and largest shared-token logprob difference (None without such a step). Over every
    prompt's such steps together (``all_prompts``): their count and the two medians, which a prompt with one
    step at a routing flip (a same-token step whose lists part: 13 of 20 shared in session W) cannot swing."""
    out: dict = {"first_divergence": [], "decode_steps": [], "median_top_overlap": [], "min_top_overlap": [],
                 "median_max_logprob_diff": [], "max_logprob_diff": []}
    every_overlap: list[float] = []
    every_diff: list[float] = []
    for i, (ta, tb) in enumerate(zip(stock["tokens"], mk["tokens"])):
        div = first_divergence(ta, tb)
        out["first_divergence"].append(div)
        if "logprobs" not in stock or "logprobs" not in mk:
            continue
        steps = list(zip(stock["logprobs"][i][1:div], mk["logprobs"][i][1:div]))
        overlap = [top_overlap(x, y) for x, y in steps]
        diffs = [d for d in (max_logprob_diff(x, y) for x, y in steps) if d is not None]
        out["decode_steps"].append(len(steps))
        out["median_top_overlap"].append(statistics.median(overlap) if overlap else None)
        out["min_top_overlap"].append(min(overlap) if overlap else None)
        out["median_max_logprob_diff"].append(statistics.median(diffs) if diffs else None)
        out["max_logprob_diff"].append(max(diffs) if diffs else None)
        every_overlap += overlap
        every_diff += diffs
    if "logprobs" in stock and "logprobs" in mk:
        out["all_prompts"] = {
            "decode_steps": len(every_overlap),
            "median_top_overlap": statistics.median(every_overlap) if every_overlap else None,
            "median_max_logprob_diff": statistics.median(every_diff) if every_diff else None}
    return out

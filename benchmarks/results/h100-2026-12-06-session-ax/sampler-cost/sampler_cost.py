"""vLLM 0.24's Sampler alone on batch 8's logits (vocab 262,144, fp32), greedy against temperature 1 with and without
per-request generators: CUDA-event time of one forward (median of 50, after 10 warm-ups) and its host time with the GPU
synced around it. Why: at batch 8 and 1K the decode_sweep step grew 0.52 / 0.58 ms (stock / megakernel) on an H100
between greedy and temperature 1 (PERF_LOG #212), ~0.35-0.5 ms of it not the routing; this says whether that is the
sampler's kernels (then the GPU time shows it) or host work the sampled path puts on the step (then only the host time
does). Ran in session AX on an H100 (`sampler-cost.md` beside this file; PERF_LOG #214), from its path then,
`benchmarks/candidates/sampler-cost/`. To run it again after the stash calls (carry install.sh, env.sh and
bundle.sha256): `source benchmarks/candidates/next-calls/bundle-env.sh /tmp && python
benchmarks/results/h100-2026-12-06-session-ax/sampler-cost/sampler_cost.py` (about half a minute). Run on the CPU
with dev = cpu and a small vocabulary it builds the metadata and samples on all three paths."""
import statistics
import time

import torch
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler

from benchmarks.sol import cuda_times

B, V = 8, 262144
dev = torch.device("cuda")


def metadata(temp: float, seeded: bool) -> SamplingMetadata:
    gens = {}
    if seeded:
        for i in range(B):
            g = torch.Generator(device=dev)
            g.manual_seed(i)
            gens[i] = g
    return SamplingMetadata(
        temperature=None if temp == 0 else torch.full((B,), temp, device=dev), all_greedy=temp == 0,
        all_random=temp > 0, top_p=None, top_k=None, generators=gens, max_num_logprobs=None, no_penalties=True,
        prompt_token_ids=None, frequency_penalties=torch.zeros(B, device=dev),
        presence_penalties=torch.zeros(B, device=dev), repetition_penalties=torch.ones(B, device=dev),
        output_token_ids=[[] for _ in range(B)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors())


def time_ms(fn) -> float:
    return statistics.median(cuda_times(fn, iters=50, warmup=10)) * 1e3


sampler = Sampler().to(dev)
base = torch.randn(B, V, device=dev, dtype=torch.float32)
rows = []
for name, temp, seeded in (("greedy", 0.0, False), ("temperature 1", 1.0, False),
                           ("temperature 1, a generator a request", 1.0, True)):
    md = metadata(temp, seeded)
    ms = time_ms(lambda: sampler(base.clone(), md))
    wall = []
    for _ in range(20):  # host time of one call, GPU synced before and after
        torch.cuda.synchronize()
        t = time.perf_counter()
        sampler(base.clone(), md)
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t) * 1e3)
    rows.append((name, ms, statistics.median(wall)))
clone = time_ms(lambda: base.clone())
print(f"| sampler on [{B}, {V}] fp32 logits | GPU ms (events, median of 50) | host ms a call, synced (median of 20) |")
print("|---|---|---|")
for name, ms, wall in rows:
    print(f"| {name} | {ms:.3f} | {wall:.3f} |")
print(f"| (the logits' clone alone, inside each row) | {clone:.3f} | - |")
print(torch.cuda.get_device_name())

"""Replays vLLM 0.24's own scheduler and KV-cache manager on the CPU for one decode-sweep case: B requests
of a context length, greedy, 256 new tokens, with the engine's block count, and a stand-in model runner
that returns one token per finished prefill. Reports the most requests that were ever decoding at once.
An independent reference for benchmarks.kv_fit, which predicts that from arithmetic.

    python tests/cpu/scheduler_replay.py CONFIG_DIR '[[context, batch, num_blocks, max_model_len], ...]'

Prints one JSON list of {"context", "batch", "max_decoding", "peak_blocks"}. Run in its own process: it
sets vLLM's current platform to the CPU one so that an engine config can be made without a GPU.
"""

import collections
import json
import logging
import random
import sys


def replay(model_dir: str, context: int, batch: int, num_blocks: int, max_model_len: int,
           new_tokens: int = 256, batched: int = 16384) -> dict:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from benchmarks.kv_fit import layer_specs

    vllm_config = EngineArgs(model=model_dir, skip_tokenizer_init=True, max_model_len=max_model_len,
                             max_num_seqs=batch, enable_prefix_caching=False, load_format="dummy", seed=0,
                             max_num_batched_tokens=batched, block_size=16,
                             async_scheduling=True).create_engine_config()
    register_all_kvcache_specs(vllm_config)
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    config = json.loads(open(f"{model_dir}/config.json").read())
    groups = get_kv_cache_groups(vllm_config, layer_specs(config))
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    sched = AsyncScheduler(vllm_config, kv, StructuredOutputManager(vllm_config), block_size=16)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens + 1, ignore_eos=True)
    for i in range(batch):
        rng = random.Random(f"0/{context}/{i}")
        sched.add_request(Request(f"r{i}", [rng.randrange(10, 100_000) for _ in range(context)], params, None))
    pool = sched.kv_cache_manager.block_pool
    in_flight = collections.deque()  # async scheduling keeps two steps in flight
    max_decoding = peak = 0
    while sched.has_requests() or in_flight:
        if sched.has_requests():
            out = sched.schedule()
            chunk = {rid: sched.requests[rid].is_prefill_chunk for rid in out.num_scheduled_tokens}
            in_flight.appendleft((out, chunk))
            peak = max(peak, num_blocks - 1 - pool.get_num_free_blocks())
            decoding = [r for r in sched.running if r.num_computed_tokens >= r.num_prompt_tokens]
            max_decoding = max(max_decoding, len(decoding))
            if len(in_flight) < 2 and sched.has_requests():
                continue
        out, chunk = in_flight.pop()
        ids = list(out.num_scheduled_tokens)
        sched.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
            sampled_token_ids=[[] if chunk[r] else [7] for r in ids]))
    return {"context": context, "batch": batch, "max_decoding": max_decoding, "peak_blocks": peak}


def main() -> None:
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()  # an engine config without a GPU
    logging.disable(logging.WARNING)
    model_dir, cases = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps([replay(model_dir, *c) for c in cases]))


if __name__ == "__main__":
    main()

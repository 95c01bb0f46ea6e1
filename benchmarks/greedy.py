"""One side of a greedy A/B: generates greedily with vllm.LLM and prints one JSON line with the token ids
(and, with --logprobs K, each step's top-K logprobs) of every prompt; with --out FILE it writes that JSON to
FILE instead, which a caller should prefer: vLLM logs to stdout, and its shutdown lines can follow the JSON.

    python -m benchmarks.greedy MODEL_DIR ADDITIONAL_CONFIG_JSON [--max-tokens N] [--logprobs K] [--out FILE]
        [--compilation full-decode-only|vllm-default]

``full-decode-only`` (the default) skips torch.compile and captures FULL CUDA graphs for decode batches
only; ``vllm-default`` keeps vLLM's own defaults (torch.compile, FULL_AND_PIECEWISE graphs).

Run once per side in a fresh process: which plugins load is decided per process (VLLM_PLUGINS).
"""

import argparse
import json
import os
import random

COMPILATION = {
    "full-decode-only": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"},
    "vllm-default": None,
}


def model_class_name(model):
    return f"{type(model).__module__}:{type(model).__name__}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("additional_config")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-lens", default="16,100,700,1500")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--logprobs", type=int, default=0)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--compilation", choices=list(COMPILATION), default="full-decode-only")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--out", help="write the JSON here instead of printing it")
    args = ap.parse_args()
    # apply_model ships a function to the engine process, which vLLM only pickles when allowed to
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    compilation = COMPILATION[args.compilation]
    llm = LLM(
        model=args.model,
        additional_config=json.loads(args.additional_config),
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=False,
        **({"compilation_config": compilation} if compilation else {}),
        seed=args.seed,
    )
    rng = random.Random(args.seed)
    prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(10, 250000) for _ in range(int(n))])
               for n in args.prompt_lens.split(",")]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True,
                            logprobs=args.logprobs or None)
    outs = llm.generate(prompts, params)
    result = {"model_class": llm.apply_model(model_class_name)[0],
              "tokens": [list(o.outputs[0].token_ids) for o in outs]}
    if args.logprobs:
        result["logprobs"] = [[{str(t): lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs]
                              for o in outs]
    if args.out:
        from benchmarks import write_json_atomic

        write_json_atomic(args.out, result)
    else:
        print(json.dumps(result))


if __name__ == "__main__":
    main()

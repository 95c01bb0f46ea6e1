"""Inside one vllm.LLM (eager, megakernel on): on every pure-decode step, run the megakernel AND vLLM's
stock forward on the same inputs and KV cache, keep vLLM's output, and record the per-row cosine between
the two final hidden states. Prints one JSON line: {"cos": [[...], ...], "steps": N, "batches": [...]}.

    python tests/gpu/stepwise_compare.py MODEL_DIR [--prompt-lens 16,100,...] [--max-num-seqs N]

Requests get different numbers of new tokens, so the batch shrinks as they finish; with --max-num-seqs
below the number of prompts, waiting requests join as others leave (their prefill steps are mixed
batches and take vLLM's path; the pure-decode steps between them take the megakernel).
"""

import argparse
import json
import os
import random
import types

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"


def patch(model):
    import torch
    from vllm.forward_context import get_forward_context

    cls = type(model)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        mk = self.megakernel
        if mk.eligible(input_ids, inputs_embeds, intermediate_tensors):
            ours = mk.decode(input_ids, positions).clone()
            # vLLM's forward rewrites the same K/V slots with its own values, so the next step starts
            # from stock's cache: every step is compared on identical inputs.
            stock = super(cls, self).forward(input_ids, positions, intermediate_tensors, inputs_embeds)
            md = get_forward_context().attn_metadata[mk.attn_layers[0].layer_name]
            live = md.seq_lens[: input_ids.shape[0]] > 0
            cos = torch.nn.functional.cosine_similarity(ours.float(), stock.float(), dim=-1)[live]
            self._stepwise_cos.append(cos.tolist())
            self._stepwise_batch.append(int(live.sum()))
            return stock
        return super(cls, self).forward(input_ids, positions, intermediate_tensors, inputs_embeds)

    model._stepwise_cos = []
    model._stepwise_batch = []
    model.forward = types.MethodType(forward, model)
    return True


def main():
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt-lens", default="16,100,700,1500,3000")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=10000)
    args = ap.parse_args()
    llm = LLM(model=args.model, additional_config={"megakernel": {"enabled": True, "strict": True}},
              max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs, gpu_memory_utilization=0.6,
              enable_prefix_caching=False, enforce_eager=True, seed=0)
    llm.apply_model(patch)
    rng = random.Random(0)
    lens = [int(n) for n in args.prompt_lens.split(",")]
    prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(10, 250000) for _ in range(n)]) for n in lens]
    # staggered lengths: requests leave one after another
    params = [SamplingParams(temperature=0.0, max_tokens=args.max_tokens - (i % 8) * (args.max_tokens // 10),
                             ignore_eos=True) for i in range(len(prompts))]
    llm.generate(prompts, params)
    cos = llm.apply_model(lambda m: m._stepwise_cos)[0]
    batches = llm.apply_model(lambda m: m._stepwise_batch)[0]
    print(json.dumps({"cos": cos, "steps": len(cos), "batches": batches}))


if __name__ == "__main__":
    main()

"""Inside one vllm.LLM (eager, megakernel on): on every pure-decode step, run the megakernel AND vLLM's
stock forward on the same inputs and KV cache, keep vLLM's output, and record the per-row cosine between
the two final hidden states and between the two sides' logits, and where their expert choices part; and the
cosine between the two sides' attention outputs of the last layer (a full-attention one in this model): over a
long history an attention output is an average of many value rows that moves the hidden state by little, so a
kernel that skipped part of the history could keep the hidden states close while its own attention output would
not be.

Router logits are bf16, so two experts can be equally good to within rounding and two correct paths may
route a row differently; once they do, that row's later layers see different inputs. So for every live row
the script records the first MoE layer whose expert set differs (or -1) and whether that difference is a
near-tie in stock's own sigmoid scores (reference.is_near_tie). Prints one JSON line: {"rows": [[hidden_cos, logit_cos,
first_flip_layer, near_tie, last_attention_cos], ...] per step, "steps": N, "batches": [...], "attention_layer": L,
"attention_layer_full": bool}.

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


def first_flip(chosen, stock_logits, moe_layers, row, top_k):
    """(layer, near_tie) of the first MoE layer where the megakernel's experts for ``row`` differ from
    stock's top-k, or (-1, True)."""
    import torch

    from vllm_megakernel.reference import is_near_tie

    for layer in moe_layers:
        scores = torch.sigmoid(stock_logits[layer][row].float())
        mine = chosen[layer, row]
        if set(scores.topk(top_k).indices.tolist()) == set(mine.tolist()):
            continue
        return layer, is_near_tie(scores, mine, top_k)
    return -1, True


def patch(model):
    import torch
    from vllm.forward_context import get_forward_context

    cls = type(model)
    mk = model.megakernel
    mk.record_routing()
    moe_layers = [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")]
    stock_logits = {}
    for i in moe_layers:  # stock's router logits, as its forward computes them
        model.model.layers[i].mlp.gate.register_forward_hook(
            lambda mod, args, out, i=i: stock_logits.__setitem__(i, out[0].detach().clone()))
    # the last layer's attention output, the O projection's input: stock's from its forward, the megakernel's left
    # in its workspace (each layer's combine rewrites "attn", and no task after the last layer's O projection does)
    stock_attn = {}
    model.model.layers[-1].self_attn.o_proj.register_forward_pre_hook(
        lambda mod, args: stock_attn.__setitem__("out", args[0].detach().clone()))
    width = mk.dims.num_heads * mk.dims.head_dim

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        if mk.eligible(input_ids, inputs_embeds, intermediate_tensors):
            batch = input_ids.shape[0]
            ours = mk.decode(input_ids, positions).clone()
            chosen = mk.recorded_routing(batch).clone()
            ours_attn = mk.workspace["attn"][:batch * width].view(batch, width).clone()
            # vLLM's forward rewrites the same K/V slots with its own values, so the next step starts
            # from stock's cache: every step is compared on identical inputs.
            stock = super(cls, self).forward(input_ids, positions, intermediate_tensors, inputs_embeds)
            md = get_forward_context().attn_metadata[mk.attn_layers[0].layer_name]
            live = (md.seq_lens[:batch] > 0).nonzero().flatten().tolist()
            cos = torch.nn.functional.cosine_similarity(ours.float(), stock.float(), dim=-1)
            # vLLM's own logits head on both (the base class's, so no error poisoning is involved)
            logits = [super(cls, self).compute_logits(h[:batch]).float() for h in (ours, stock)]
            logit_cos = torch.nn.functional.cosine_similarity(*logits, dim=-1)
            attn_cos = torch.nn.functional.cosine_similarity(
                ours_attn.float(), stock_attn["out"][:batch].reshape(batch, width).float(), dim=-1)
            rows = []
            for r in live:
                layer, tie = first_flip(chosen, stock_logits, moe_layers, r, mk.dims.top_k)
                rows.append([cos[r].item(), logit_cos[r].item(), layer, tie, attn_cos[r].item()])
            self._stepwise_rows.append(rows)
            return stock
        return super(cls, self).forward(input_ids, positions, intermediate_tensors, inputs_embeds)

    model._stepwise_rows = []
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
              max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs, gpu_memory_utilization=0.4,
              enable_prefix_caching=False, enforce_eager=True, seed=0)
    llm.apply_model(patch)
    rng = random.Random(0)
    lens = [int(n) for n in args.prompt_lens.split(",")]
    prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(10, 250000) for _ in range(n)]) for n in lens]
    # staggered lengths: requests leave one after another
    params = [SamplingParams(temperature=0.0, max_tokens=args.max_tokens - (i % 8) * (args.max_tokens // 10),
                             ignore_eos=True) for i in range(len(prompts))]
    llm.generate(prompts, params)
    rows, last, last_full = llm.apply_model(
        lambda m: (m._stepwise_rows, m.megakernel.dims.num_layers - 1, not m.megakernel.dims.sliding[-1]))[0]
    print(json.dumps({"rows": rows, "steps": len(rows), "batches": [len(r) for r in rows],
                      "attention_layer": last, "attention_layer_full": last_full}))


if __name__ == "__main__":
    main()

# Run on the CPU machine: python3 kv_magnitudes_cpu.py (after: python -m vllm_megakernel.tools.make_checkpoint configs/north-mini-code /tmp/nmc-5l --seed 1 --num-layers 5)
# Session N, CPU: the batch-64 step test's new K/V magnitudes, and how far a bf16 reference sits from an fp32 one
# (same expert choice) under the old elementwise check and the new per-vector check.
import dataclasses, torch
from vllm_megakernel import reference as ref
from vllm_megakernel.paged_kv import PagedKVSim
torch.set_num_threads(2)
ck = "/tmp/nmc-5l"
dims = ref.ModelDims.from_config(ck)
lengths = [int(x) for x in torch.randint(1, 3000, (61,), generator=torch.Generator().manual_seed(6))]
batch = 64
def inputs(dtype):
    gen = torch.Generator().manual_seed(0)
    sim = PagedKVSim(dims, num_requests=batch, max_len=max(lengths) + 1, block_size=16, dtype=dtype, device="cpu", seed=0)
    sim.fill_history(list(lengths) + [0] * (batch - len(lengths)), generator=gen, values=True)
    toks = [int(torch.randint(0, dims.vocab, (1,), generator=gen)) for _ in lengths] + [None] * 3
    return sim.step(toks)
routing = {}
w16 = ref.Weights.from_checkpoint(ck, dims, dtype=torch.bfloat16)
i16 = inputs(torch.bfloat16)
out16 = ref.decode_step(dims, w16, i16, routing=routing)
chosen = torch.zeros(dims.num_layers, batch, dims.top_k, dtype=torch.long)
for layer, (scores, own) in routing.items():
    chosen[layer] = own
del w16
w32 = ref.Weights.from_checkpoint(ck, dims, dtype=torch.float32)
i32 = inputs(torch.float32)
out32 = ref.decode_step(dims, w32, i32, forced_experts=chosen)
def vecs(inp, layer):
    slots = inp.groups[inp.layer_group[layer]].slot_mapping
    rows = torch.nonzero(slots >= 0).flatten(); s = slots[rows].long()
    c = inp.kv_caches[layer]
    return c[s // 16, :, s % 16].float().reshape(len(rows), 2, -1)
for layer in range(dims.num_layers):
    a, b = vecs(i32, layer), vecs(i16, layer)   # a: fp32 reference, b: bf16 reference
    vmax = a.abs().amax(-1)
    diff = (a - b).abs()
    excess = (diff - (0.05 + 0.02 * a.abs())).amax()
    err = diff.amax(-1) / vmax
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    print(f"layer {layer}: vector max |K| median {vmax[:,0].median():.3f} min {vmax[:,0].min():.3f}, |V| median {vmax[:,1].median():.3f} min {vmax[:,1].min():.3f}; "
          f"element std K {a[:,0].std():.3f} V {a[:,1].std():.3f}; bf16 vs fp32: max |diff| {diff.max():.4f}, old-check worst excess {excess:+.4f}, "
          f"new: max rel err {err.max():.4f} (median {err.median():.4f}), min cos {cos.min():.6f}", flush=True)
live = torch.arange(batch) < 61
e = (out16.float() - out32.float())[live]
print("output: max rel err", (e.abs().amax(-1) / out32.float()[live].abs().amax(-1)).max().item(),
      "min cos", torch.nn.functional.cosine_similarity(out16.float()[live], out32.float()[live], dim=-1).min().item())

"""Each opcode of the megakernel against its torch version, on the kernel's own inputs.

For one wave of one layer: the kernel runs the step cut just before the wave (Schedule.truncated) and cut
just after it, from the same KV cache. The state before is loaded into the CPU simulator's torch
interpreter (megakernel.simulate.Numerics, the same code the CI simulator tests check against the reference
decode step), which executes the wave's tasks; its outputs must match the kernel's. An error in one opcode
therefore shows up in that opcode's test, not somewhere downstream.

Full width (the 5-layer realistic random checkpoint: dense + RoPE full layer 0, sliding MoE layers 1-3, NoPE
full MoE layer 4), batches of 4 and 20 with contexts above, at and below the 4096 window and one padding row.
Tolerances (bf16 buffers, fp32 accumulation in a different order on each side): per live row cosine >=
0.9999 and max abs error <= 2% of the buffer's largest magnitude; the pattern of unwritten (NaN) and empty
(-inf) entries must be identical, so nothing is written that should not be and nothing is missed.
"""

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.gpu

LENGTHS = [5000, 4096, 300]  # live rows; padding rows follow

# (batch, layer, wave): every opcode at least once, attention on a full RoPE, a sliding and a NoPE full layer.
# Batch 4 folds the norm into the qkv / router / dense up tasks; batch 20 runs the norm wave and the
# GEMMs' grouped form (more than 16 rows).
CASES = [
    (4, 0, "qkv"), (4, 0, "attn_partial"), (4, 0, "mlp_up"), (4, 0, "mlp_down"), (4, 0, "attn_combine"),
    (4, 0, "o_proj"),
    (4, 1, "router"), (4, 1, "qkv"), (4, 1, "router_topk"), (4, 1, "attn_partial"), (4, 1, "mlp_up"),
    (4, 1, "mlp_down"), (4, 1, "attn_combine"), (4, 1, "o_proj"), (4, 1, "moe_combine"),
    (4, 4, "qkv"), (4, 4, "attn_partial"), (4, 4, "attn_combine"),
    (4, 5, "final_norm"),
    (20, 0, "norm"), (20, 1, "norm"), (20, 1, "router"), (20, 1, "qkv"), (20, 1, "mlp_up"), (20, 1, "mlp_down"),
    (20, 1, "o_proj"), (20, 1, "moe_combine"),
    # combine tasks of 8 heads, as from batch 9 on (batch 4 takes 4 a task), a sliding and a NoPE full layer
    (20, 1, "attn_combine"), (20, 4, "attn_combine"),
]


def outputs(dims, batch, layer, wave):
    """Workspace buffers a wave writes (besides the KV cache of the qkv wave) as (name, the index of the
    layer's part: its parity for x, o and mlp, the layer for scores; None for buffers of one part)."""
    from vllm_megakernel.megakernel import layout

    p, fold = layer % 2, layout.fold_norm(batch)
    dense = layer < dims.num_layers and dims.dense[layer]
    return {"norm": (("x", p), ("hn", None)), "router": (("scores", layer),) + ((("hn", None),) if fold else ()),
            "qkv": (("q", None),) + ((("x", p),) if fold else ()), "router_topk": (("topk_w", None),),
            "attn_partial": (("opart", None), ("lse", None)), "attn_combine": (("attn", None),),
            "o_proj": (("o", p),), "mlp_up": (("dact" if dense else "act", None),),
            "mlp_down": (("mlp", p),) if dense else (("eout", None),), "moe_combine": (("mlp", p),),
            "final_norm": (("x", p), ("out", None))}[wave]


@pytest.fixture(scope="module")
def weights(shallow_checkpoint):
    from vllm_megakernel import reference as ref

    dims = ref.ModelDims.from_config(shallow_checkpoint)
    return dims, ref.Weights.from_checkpoint(shallow_checkpoint, dims, dtype=torch.bfloat16).to("cuda")


@pytest.fixture(scope="module")
def setups(weights):
    from vllm_megakernel.megakernel.schedule import StepShape, build_schedule
    from vllm_megakernel.paged_kv import PagedKVSim

    dims, w = weights
    made = {}

    def setup(batch):
        if batch not in made:
            gen = torch.Generator().manual_seed(11)
            lengths = (LENGTHS * 7)[: batch - 1]
            sim = PagedKVSim(dims, num_requests=batch, max_len=max(lengths) + 1, block_size=16,
                             dtype=torch.bfloat16, device="cuda", seed=11)
            sim.fill_history(lengths + [0], generator=gen)
            inp = sim.step([int(torch.randint(0, dims.vocab, (1,), generator=gen)) for _ in lengths] + [None])
            num_sms = torch.cuda.get_device_properties(0).multi_processor_count
            sched = build_schedule(dims, StepShape(batch=batch, num_sms=num_sms, attn_splits=4), *w.intermediates())
            made[batch] = (dims, w, inp, sched)
        return made[batch]

    return setup


def run_prefix(sched, w, inp, num_tasks):
    """The kernel on the step's first num_tasks tasks, from a fresh copy of the KV cache."""
    from vllm_megakernel.megakernel import runtime

    mine = dataclasses.replace(inp, kv_caches=[c.clone() for c in inp.kv_caches])
    step = runtime.build_step(sched.truncated(num_tasks), w, mine)
    runtime.run_step(step)
    torch.cuda.synchronize()
    return {k: v.clone() for k, v in step.workspace.items()}, mine.kv_caches


def assert_matches(name, got, exp, live_rows):
    got, exp = got.float()[live_rows], exp.float()[live_rows]
    fin = torch.isfinite(exp)
    assert torch.equal(fin, torch.isfinite(got)), f"{name}: finite entries differ (missed or stray writes)"
    same_special = (got[~fin] == exp[~fin]) | (got[~fin].isnan() & exp[~fin].isnan())
    assert same_special.all(), f"{name}: -inf/NaN entries differ"
    if not fin.any():
        return
    g, e = got.where(fin, 0).flatten(1), exp.where(fin, 0).flatten(1)
    scale = e.abs().max()
    err = (g - e).abs().max()
    assert err <= 0.02 * scale + 1e-6, f"{name}: max abs error {err:.4g} vs scale {scale:.4g}"
    nonzero = e.norm(dim=1) > 0
    assert torch.equal(nonzero, g.norm(dim=1) > 0), f"{name}: a row is zero on one side only"
    if nonzero.any():
        cos = torch.nn.functional.cosine_similarity(g[nonzero], e[nonzero], dim=1)
        assert cos.min() >= 0.9999, f"{name}: row cosine {cos.tolist()}"


def per_row_experts(num, batch, top_k):
    experts = torch.full((batch, top_k), -1, dtype=torch.long)
    for e, rows in zip(num.slot_expert, num.slot_rows):
        for rk in rows:
            experts[rk // top_k, rk % top_k] = e
    return experts


@pytest.mark.parametrize("batch, layer, wave", CASES, ids=[f"B{b}-L{layer}-{wave}" for b, layer, wave in CASES])
def test_wave_matches_its_torch_version_on_the_kernels_inputs(setups, batch, layer, wave):
    from vllm_megakernel.megakernel import simulate

    dims, w, inp, sched = setups(batch)
    start, stop = sched.wave_range(layer, wave)
    ops = sorted({t.op.name for t in sched.tasks[start:stop]})
    before, caches = run_prefix(sched, w, inp, start)
    after, kernel_caches = run_prefix(sched, w, inp, stop)

    torch_side = simulate.Numerics(sched, w, dataclasses.replace(inp, kv_caches=[c.clone() for c in caches]))
    torch_side.load_workspace(before)
    for t in sched.tasks[start:stop]:
        torch_side(t)
    kernel_side = simulate.Numerics(sched, w, inp)
    kernel_side.load_workspace(after)

    live = (inp.seq_lens > 0).cpu()
    live_rows = torch.nonzero(live).flatten()
    K = dims.top_k
    for name, parity in outputs(dims, batch, layer, wave):
        rows = live_rows
        if name in ("act", "eout"):  # rows are (token, k) pairs
            rows = (live_rows[:, None] * K + torch.arange(K)).flatten()
        got, exp = getattr(kernel_side, name).cpu(), getattr(torch_side, name).cpu()
        if parity is not None:  # x, o, mlp: the layer's half of the two-layer buffer; scores: the layer's
            got, exp = got[parity], exp[parity]
        assert_matches(f"{ops} {name}", got, exp, rows)
    if wave == "qkv":  # the new K/V: same slots, same values, nothing else touched
        assert_matches(f"{ops} kv cache", kernel_caches[layer].flatten(0, 2).cpu(),
                       torch_side.inp.kv_caches[layer].flatten(0, 2).cpu(),
                       torch.arange(kernel_caches[layer].flatten(0, 2).shape[0]))
    if wave == "router_topk":  # on the same fp32 scores the choice (ties to the lower id) is exact
        got, exp = per_row_experts(kernel_side, batch, K), per_row_experts(torch_side, batch, K)
        assert (got[~live] == -1).all(), "padding rows must route nowhere"
        assert torch.equal(got, exp), f"experts differ: {got.tolist()} vs {exp.tolist()}"
        assert kernel_side.slot_expert == torch_side.slot_expert and kernel_side.slot_rows == torch_side.slot_rows
    print(f"L{layer} {wave} ({', '.join(ops)}): tasks {start}-{stop - 1} match")

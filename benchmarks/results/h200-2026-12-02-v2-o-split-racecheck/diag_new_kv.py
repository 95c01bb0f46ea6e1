"""Session N diagnostic (not a test): how far each layer's new K/V is from the reference's on the batch-64 step
where ccpf failed check_new_kv (call 1), for whichever extension is installed. The step tests' own
one_step runs the step; its check_new_kv is replaced by one that prints, per layer, the largest |kernel - ref|
over the new slots and the worst excess over the tests' tolerance (atol 0.05 + rtol 0.02 |ref|; > 0 fails),
with the row and the K/V half where it sits. The final output's cosine / max rel err (one_step's compare) too.

    MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l python3 diag_new_kv.py
"""
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import tests.gpu.test_megakernel_step as t  # noqa: E402
from vllm_megakernel import reference as ref  # noqa: E402


def kv_margins(ref_inp, mk_inp, finite_caches=None):  # the check took a third argument until b0e4f45
    for layer, (a, b) in enumerate(zip(ref_inp.kv_caches, mk_inp.kv_caches)):
        slots = ref_inp.groups[ref_inp.layer_group[layer]].slot_mapping
        rows = torch.nonzero(slots >= 0).flatten()
        s = slots[rows].long()
        bs = a.shape[2]
        ka, kb = a[s // bs, :, s % bs].float(), b[s // bs, :, s % bs].float()  # [rows, 2 (K/V) ..., heads, dim]
        diff = (ka - kb).abs()
        excess = diff - (0.05 + 0.02 * ka.abs())
        flat = int(excess.flatten().argmax())
        idx = torch.unravel_index(torch.tensor(flat), excess.shape)
        outside = torch.isfinite(a) != torch.isfinite(b)
        print(f"  layer {layer}: new K/V max |diff| {diff.max().item():.4f}, worst excess {excess.max().item():+.4f} "
              f"(row {int(rows[idx[0]])}, index {[int(i) for i in idx[1:]]}, ref {ka[idx].item():.4f}, "
              f"kernel {kb[idx].item():.4f}); elements over: {int((excess > 0).sum())} of {excess.numel()}; "
              f"finite-pattern mismatches: {int(outside.sum())}", flush=True)


t.check_new_kv = kv_margins
shallow = Path(os.environ["MEGAKERNEL_TEST_CHECKPOINT"])
dims = ref.ModelDims.from_config(shallow)
w = ref.Weights.from_checkpoint(shallow, dims, dtype=torch.bfloat16).to("cuda")
# The two failing tests ran the same step (batch 64, 61 live rows of seed-6 lengths, 4 splits; the fold is
# batch 64's default): run it twice, which also shows whether the differences repeat.
lengths = [int(x) for x in torch.randint(1, 3000, (61,), generator=torch.Generator().manual_seed(6))]
for run in range(2):
    print(f"batch 64, 61 live rows, 4 splits, run {run}", flush=True)
    try:
        (cos, err), _ = t.one_step(dims, w, lengths, 64, 4)
        print(f"  output: min cosine {cos:.6f}, max rel err {err:.4f}", flush=True)
    except AssertionError as e:
        print(f"  output check failed: {str(e)[:300]}", flush=True)

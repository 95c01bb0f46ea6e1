"""Synthetic KV history (what GPU tests use for long contexts) is laid out as stepping would leave it."""

import json

import torch

from conftest import TINY_CONFIG
from vllm_megakernel import reference as ref
from vllm_megakernel.paged_kv import PagedKVSim
from vllm_megakernel.tools.make_checkpoint import make_tensor, tensor_specs


def test_history_keeps_only_blocks_the_next_token_can_see():
    dims = ref.ModelDims.from_config(TINY_CONFIG)
    sim = PagedKVSim(dims, num_requests=2, max_len=40, block_size=4, seed=0)
    sim.fill_history([30, 3], generator=torch.Generator().manual_seed(0))
    full_g, slide_g = sim.layer_group[0], sim.layer_group[1]
    assert (sim.tables[full_g][0, :8] != 0).all()  # 30 tokens: 8 blocks on full layers
    # the next query, at position 30, sees 23..30 (window 8): blocks 0..4 hold nothing it needs
    assert (sim.tables[slide_g][0, :5] == 0).all() and (sim.tables[slide_g][0, 5:8] != 0).all()
    inp = sim.step([1, 2])
    assert inp.positions.tolist() == [30, 3] and inp.seq_lens.tolist() == [31, 4]
    cfg = json.loads((TINY_CONFIG / "config.json").read_text())
    sd = {name: make_tensor(name, shape, is_norm, 0, 0.02, torch.float32)
          for name, shape, is_norm in tensor_specs(cfg)}
    out = ref.decode_step(dims, ref.Weights.from_hf_state_dict(sd, dims), inp)
    assert torch.isfinite(out).all()  # no read of an unwritten (NaN) slot

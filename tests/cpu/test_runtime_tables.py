"""The step and layer tables the kernel reads are built from the ABI field lists and point at the right
tensors (built on CPU tensors here; only addresses and integers are involved)."""

import struct

import torch

from conftest import TINY_CONFIG
from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel import abi, runtime
from vllm_megakernel.megakernel.schedule import StepShape, build_schedule
from vllm_megakernel.paged_kv import PagedKVSim


def test_tables_point_at_weights_caches_and_vllm_buffers(tiny_checkpoint):
    dims = ref.ModelDims.from_config(TINY_CONFIG)
    w = ref.Weights.from_checkpoint(tiny_checkpoint, dims, dtype=torch.bfloat16)
    sim = PagedKVSim(dims, num_requests=3, max_len=20, block_size=4, dtype=torch.bfloat16)
    sim.fill_history([5, 9], generator=torch.Generator().manual_seed(0))
    inp = sim.step([1, 2, None])
    inp.input_ids = inp.input_ids.to(torch.int32)  # vLLM's dtypes: the tables must reference, not copy
    inp.seq_lens = inp.seq_lens.to(torch.int32)
    sched = build_schedule(dims, StepShape(batch=3, num_sms=4, tile_n=16, attn_splits=2), *w.intermediates())
    step = runtime.build_step(sched, w, inp, timeout_s=1.5)

    s = dict(zip(abi.STEP_FIELDS, step.step_table.tolist()))
    assert (s["batch"], s["hidden"], s["head_dim"], s["tile_n"], s["attn_splits"]) == (3, 64, 16, 16, 2)
    assert struct.unpack("<d", struct.pack("<q", s["eps_f64"]))[0] == dims.eps
    assert s["timeout_ns"] == 1_500_000_000 and s["block_size"] == 4
    assert s["input_ids"] == inp.input_ids.data_ptr() and s["positions"] == inp.positions.data_ptr()
    assert s["seq_lens"] == inp.seq_lens.data_ptr() and s["embed"] == w.embed.data_ptr()
    assert s["out"] == step.workspace["out"].data_ptr() and s["route_log"] == 0

    for layer, row in enumerate(step.layer_table.tolist()):
        r = dict(zip(abi.LAYER_FIELDS, row))
        lw, cache = w.layers[layer], inp.kv_caches[layer]
        assert (r["dense"], r["sliding"], r["rope"]) == (dims.dense[layer], dims.sliding[layer], dims.rope[layer])
        assert r["qkv_w"] == lw.qkv.data_ptr() and r["norm_w"] == lw.norm.data_ptr()
        assert r["w13"] == (lw.w13.data_ptr() if lw.w13 is not None else 0)
        assert r["kv_cache"] == cache.data_ptr()
        assert (r["kv_stride_block"], r["kv_stride_kv"], r["kv_stride_token"], r["kv_stride_head"]) == cache.stride()[:4]
        group = inp.groups[inp.layer_group[layer]]
        assert r["block_table"] == group.block_table.data_ptr()
        assert r["slot_mapping"] == group.slot_mapping.data_ptr()
        assert r["block_table_stride"] == group.block_table.stride(0)

    enc = step.tasks
    assert enc.shape[0] == 4 and enc.dtype == torch.int32
    assert int((enc[:, :, 0] != 0).sum()) == len(sched.tasks)
    assert int(step.error[abi.ERROR_FIELDS.index("sm")]) == -1  # the CAS in barrier.cuh expects it

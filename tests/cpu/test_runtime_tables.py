"""The step and layer tables the kernel reads are built from the ABI field lists and point at the right
tensors (built on CPU tensors here; only addresses and integers are involved)."""

import struct

import pytest
import torch

from conftest import TINY_CONFIG
from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel import abi, layout, runtime
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
    sched = build_schedule(dims, StepShape(batch=3, num_sms=4, attn_splits=2, attn_min_tiles=3), *w.intermediates())
    step = runtime.build_step(sched, w, inp, timeout_s=1.5)

    s = dict(zip(abi.STEP_FIELDS, step.step_table.tolist()))
    assert (s["batch"], s["attn_splits"], s["attn_min_tiles"], s["num_slots"]) == (3, 2, 3, sched.num_slots)
    assert struct.unpack("<d", struct.pack("<q", s["eps_f64"]))[0] == dims.eps
    assert s["timeout_ns"] == 1_500_000_000 and s["block_size"] == 4
    assert s["stages_in_flight"] == sched.shape.stages_in_flight == layout.stages_in_flight_for(3)
    assert s["o_prefetch"] == 0  # StepShape.o_prefetch's default
    prefetching = build_schedule(dims, StepShape(batch=3, num_sms=4, attn_splits=2, attn_min_tiles=3, o_prefetch=True),
                                 *w.intermediates())
    assert dict(zip(abi.STEP_FIELDS, runtime.build_step(prefetching, w, inp).step_table.tolist()))["o_prefetch"] == 1
    off = layout.route_offsets(dims, 3)
    assert (s["route_expert_off"], s["route_count_off"], s["route_rows_off"]) == (off["expert"], off["count"], off["rows"])
    for name, (shape, _) in layout.workspace_spec(dims, 3, 2, *w.intermediates()).items():
        assert s[name] == step.workspace[name].data_ptr() and step.view(name).shape == shape
    # the tiny model is not the shape the kernel is compiled for: tables build, the launch refuses
    assert any("hidden=64" in r for r in step.unsupported)
    with pytest.raises(ValueError, match="compiled for another model shape"):
        runtime.launch(step)
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


def test_a_step_built_from_a_kept_encoding_is_the_step_built_from_its_schedule(tiny_checkpoint):
    """vLLM builds each batch size's step twice at start-up; the decoder keeps the schedule's encoding and passes
    it in: the tables are the same, and an encoding of another schedule is refused."""
    dims = ref.ModelDims.from_config(TINY_CONFIG)
    w = ref.Weights.from_checkpoint(tiny_checkpoint, dims, dtype=torch.bfloat16)
    sim = PagedKVSim(dims, num_requests=2, max_len=20, block_size=4, dtype=torch.bfloat16)
    sim.fill_history([5, 9], generator=torch.Generator().manual_seed(0))
    inp = sim.step([1, 2])
    sched = build_schedule(dims, StepShape(batch=2, num_sms=4, attn_splits=2), *w.intermediates())
    fresh = runtime.build_step(sched, w, inp)
    kept = runtime.build_step(sched, w, inp, encoded=sched.encode())
    assert torch.equal(kept.tasks, fresh.tasks) and torch.equal(kept.layer_table, fresh.layer_table)
    other = build_schedule(dims, StepShape(batch=2, num_sms=3, attn_splits=2), *w.intermediates())
    with pytest.raises(ValueError, match="not this schedule's"):
        runtime.build_step(sched, w, inp, encoded=other.encode())


def test_steps_built_with_one_stall_record_share_it_and_a_wrong_record_is_refused(tiny_checkpoint):
    dims = ref.ModelDims.from_config(TINY_CONFIG)
    w = ref.Weights.from_checkpoint(tiny_checkpoint, dims, dtype=torch.bfloat16)
    sim = PagedKVSim(dims, num_requests=2, max_len=20, block_size=4, dtype=torch.bfloat16)
    sim.fill_history([5, 9], generator=torch.Generator().manual_seed(0))
    record = runtime.new_error_record("cpu")
    steps = [runtime.build_step(build_schedule(dims, StepShape(batch=2, num_sms=n, attn_splits=2), *w.intermediates()),
                                w, sim.step([1, 2]), error=record) for n in (3, 4)]
    assert all(s.error is record for s in steps)
    assert runtime.build_step(steps[0].schedule, w, sim.step([1, 2])).error is not record  # private by default
    with pytest.raises(ValueError, match="a stall record is int32"):
        runtime.build_step(steps[0].schedule, w, sim.step([1, 2]), error=torch.zeros(3, dtype=torch.int32))


def test_posted_route_words_sit_zeroed_after_the_barriers_and_a_stall_on_one_names_the_layer_and_slot(tiny_checkpoint):
    """StepShape.posted_routing: the step's barrier array holds, 8-byte aligned after the barriers, one uint64
    word per layer and per slot plus one a layer (layout.route_post_words), which the step table's route_posts
    points at and which launch() zeroes with the barriers; without it there are none and the field is 0. A
    producer that timed out polling one is reported by layer and slot, not as a barrier."""
    dims = ref.ModelDims.from_config(TINY_CONFIG)
    w = ref.Weights.from_checkpoint(tiny_checkpoint, dims, dtype=torch.bfloat16)
    sim = PagedKVSim(dims, num_requests=2, max_len=20, block_size=4, dtype=torch.bfloat16)
    sim.fill_history([5, 9], generator=torch.Generator().manual_seed(0))
    inp = sim.step([1, 2])
    for posted in (False, True):
        sched = build_schedule(dims, StepShape(batch=2, num_sms=4, attn_splits=2, posted_routing=posted,
                                               posted_scores=False),  # the route words alone
                               *w.intermediates())
        step = runtime.build_step(sched, w, inp)
        s = dict(zip(abi.STEP_FIELDS, step.step_table.tolist()))
        words = layout.route_post_words(dims, 2) if posted else 0
        at = (sched.num_barriers + 1) // 2 * 2
        assert s["posted_routing"] == int(posted) and sched.route_post_words == words
        assert step.barriers.numel() == at + 2 * words and not step.barriers.any()
        assert s["route_posts"] == (step.barriers.data_ptr() + 4 * at if posted else 0) and s["route_posts"] % 8 == 0
    topk = next(t for t in sched.tasks if t.op == abi.Op.ROUTER_TOPK)
    victim = next(t for t in sched.tasks if t.op == abi.Op.MOE_UPGATE and t.layer == topk.layer)
    record = {"flag": 1, "sm": victim.sm, "task_index": victim.index, "opcode": int(victim.op), "layer": victim.layer,
              "barrier": abi.POSTED_ROUTE_WAIT, "expected": 3, "seen": -1}
    step.error.copy_(torch.tensor([record[f] for f in abi.ERROR_FIELDS], dtype=torch.int32))
    with pytest.raises(runtime.MegakernelStallError,
                       match=rf"task {victim.index} \(MOE_UPGATE.* polled layer {victim.layer}'s posted route for "
                             r"slot 3: not posted"):
        runtime.check(step)


def test_posted_score_keys_sit_zeroed_after_the_route_words_and_a_stall_on_them_names_the_layer_and_row(
        tiny_checkpoint):
    """StepShape.posted_scores: the step's barrier array holds, after the barriers and the posted route words, one
    uint32 key per layer, batch row and expert (layout.score_post_words), which the step table's score_posts
    points at, launch() zeroes with the barriers and runtime.score_posts views; without it there are none and the
    field is 0. A top-k that timed out polling them is reported by layer and batch row, not as a barrier."""
    dims = ref.ModelDims.from_config(TINY_CONFIG)
    w = ref.Weights.from_checkpoint(tiny_checkpoint, dims, dtype=torch.bfloat16)
    sim = PagedKVSim(dims, num_requests=2, max_len=20, block_size=4, dtype=torch.bfloat16)
    sim.fill_history([5, 9], generator=torch.Generator().manual_seed(0))
    inp = sim.step([1, 2])
    for routing, scores in ((False, False), (True, False), (True, True)):
        sched = build_schedule(dims, StepShape(batch=2, num_sms=4, attn_splits=2, posted_routing=routing,
                                               posted_scores=scores), *w.intermediates())
        step = runtime.build_step(sched, w, inp)
        s = dict(zip(abi.STEP_FIELDS, step.step_table.tolist()))
        keys = layout.score_post_words(dims, 2) if scores else 0
        at = (sched.num_barriers + 1) // 2 * 2 + 2 * sched.route_post_words
        assert sched.score_post_words == keys == (dims.num_layers * 2 * dims.num_experts if scores else 0)
        assert step.barriers.numel() == at + keys and not step.barriers.any()
        assert s["score_posts"] == (step.barriers.data_ptr() + 4 * at if scores else 0)
        if scores:
            view = runtime.score_posts(step)
            assert view.shape == (dims.num_layers, 2, dims.num_experts)
            assert view.data_ptr() == s["score_posts"]
        else:
            with pytest.raises(ValueError, match="no posted scores"):
                runtime.score_posts(step)
    topk = next(t for t in sched.tasks if t.op == abi.Op.ROUTER_TOPK)
    record = {"flag": 1, "sm": topk.sm, "task_index": topk.index, "opcode": int(topk.op), "layer": topk.layer,
              "barrier": abi.POSTED_SCORE_WAIT, "expected": 1, "seen": 37}
    step.error.copy_(torch.tensor([record[f] for f in abi.ERROR_FIELDS], dtype=torch.int32))
    with pytest.raises(runtime.MegakernelStallError,
                       match=rf"task {topk.index} \(ROUTER_TOPK.* polled layer {topk.layer}'s posted scores of "
                             rf"batch row 1: 37 of {dims.num_experts} posted"):
        runtime.check(step)

"""The GPU step tests' K/V check (tests/gpu/test_megakernel_step.py's check_new_kv) on CPU caches: it passes a
kernel whose new K/V differ from the reference's by bf16-level noise, and fails a wrong new vector, a write into
a history slot, and a write into an unused (NaN) slot, naming the layer."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

from vllm_megakernel import reference as ref
from vllm_megakernel.paged_kv import PagedKVSim

STEP_TESTS = Path(__file__).resolve().parents[1] / "gpu" / "test_megakernel_step.py"


@pytest.fixture(scope="module")
def check_new_kv():
    spec = importlib.util.spec_from_file_location("gpu_step_tests", STEP_TESTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.check_new_kv


def caches():
    """A reference side and a kernel side of one decode step's caches (3 layers, 2 live rows and a padding
    row; histories filled, unused slots NaN), with the same random new K/V written on both."""
    dims = dataclasses.replace(ref.ModelDims.from_config(Path(__file__).resolve().parents[2] / "configs" / "north-mini-code"),
                               num_layers=3)
    sim = PagedKVSim(dims, num_requests=3, max_len=40, block_size=16, dtype=torch.bfloat16)
    sim.fill_history([5, 30, 0], generator=torch.Generator().manual_seed(0))
    inp = sim.step([1, 2, None])
    gen = torch.Generator().manual_seed(1)
    for layer, cache in enumerate(inp.kv_caches):
        slots = inp.groups[inp.layer_group[layer]].slot_mapping
        slots = slots[slots >= 0].long()
        blk, off = slots // cache.shape[2], slots % cache.shape[2]
        cache[blk, :, off] = torch.randn(cache[blk, :, off].shape, generator=gen).to(cache.dtype)
    mk = dataclasses.replace(inp, kv_caches=[c.clone() for c in inp.kv_caches])
    return inp, mk


def new_slot(inp, layer, row):
    slot, bs = int(inp.groups[inp.layer_group[layer]].slot_mapping[row]), inp.kv_caches[layer].shape[2]
    return slot // bs, slot % bs


def test_new_kv_within_bf16_noise_passes(check_new_kv):
    inp, mk = caches()
    for layer, cache in enumerate(mk.kv_caches):
        for row in (0, 1):
            blk, off = new_slot(inp, layer, row)
            v = cache[blk, :, off].float()
            cache[blk, :, off] = (v * (1 + 0.004 * torch.randn(v.shape, generator=torch.Generator().manual_seed(row)))).to(cache.dtype)
    check_new_kv(inp, mk)


def test_a_wrong_new_head_fails(check_new_kv):
    inp, mk = caches()
    blk, off = new_slot(inp, 2, 1)
    mk.kv_caches[2][blk, 1, off, 3] = 0  # batch row 1's V, the last KV head, zeroed
    with pytest.raises(AssertionError, match="layer 2, batch row 1, new V"):
        check_new_kv(inp, mk)


def test_a_write_into_a_history_slot_fails(check_new_kv):
    inp, mk = caches()
    blk, off = new_slot(inp, 1, 1)
    mk.kv_caches[1][blk, 0, off - 1, 0, 5] += 1  # the token before row 1's new one
    with pytest.raises(AssertionError, match="layer 1: the kernel wrote outside the new slots"):
        check_new_kv(inp, mk)


def test_a_write_into_an_unused_slot_fails(check_new_kv):
    inp, mk = caches()
    cache = mk.kv_caches[0]
    blk, off = torch.nonzero(cache[:, 0, :, 0, 0].isnan())[-1].tolist()
    cache[blk, 0, off] = 0
    with pytest.raises(AssertionError, match="layer 0: the kernel wrote outside the new slots"):
        check_new_kv(inp, mk)


def test_caches_filled_whole_pass_clean_and_fail_a_history_write(check_new_kv):
    """Long contexts fill whole caches with finite values (no NaN slots): a clean step passes, a write
    outside the new slots fails."""
    inp, mk = caches()
    gen = torch.Generator().manual_seed(2)
    for a, b in zip(inp.kv_caches, mk.kv_caches):
        fill = torch.randn(a.shape, generator=gen).to(a.dtype)
        nan = a.isnan()
        a[nan] = fill[nan]
        b[nan] = fill[nan]
    check_new_kv(inp, mk)
    inp, mk = caches()
    for a, b in zip(inp.kv_caches, mk.kv_caches):
        a.nan_to_num_(0.0)
        b.nan_to_num_(0.0)
    mk.kv_caches[2][0, 1, 0, 2, 7] += 0.5  # block 0, V, its token 0: no new slot (the new tokens sit at 5 and 30)
    with pytest.raises(AssertionError, match="layer 2: the kernel wrote outside the new slots"):
        check_new_kv(inp, mk)

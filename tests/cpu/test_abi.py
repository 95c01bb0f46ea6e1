"""One source of truth for the ABI: csrc/abi.h is exactly what abi.py generates; descriptors round-trip; the
model shape the kernel is compiled for is the North Mini Code config's."""

import json

import pytest

from conftest import FULL_CONFIG, REPO, TINY_CONFIG
from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel import abi, layout


def test_committed_header_is_generated_from_abi_py():
    committed = (REPO / "csrc" / "abi.h").read_text()
    assert committed == abi.render_header(), (
        "csrc/abi.h is stale: run python -m vllm_megakernel.megakernel.abi --write csrc/abi.h"
    )


def test_descriptor_round_trip_for_every_opcode():
    for op in abi.Op:
        fields = {name: 100 + i for i, name in enumerate(abi.OP_FIELDS[op])}
        words = abi.encode(op, 7, [(3, 5), (9, 2)], 11, 42, (13, 6), **fields)
        assert len(words) == abi.TASK_WORDS
        got = abi.decode(words)
        assert got["opcode"] == op and got["layer"] == 7 and got["task_index"] == 42
        assert (got["load_wait_barrier"], got["load_wait_count"]) == (13, 6)
        assert (got["wait0_barrier"], got["wait0_count"], got["wait1_barrier"], got["wait1_count"]) == (3, 5, 9, 2)
        assert got["signal_barrier"] == 11
        assert all(got[k] == v for k, v in fields.items())


def test_missing_or_unknown_fields_are_refused():
    with pytest.raises(ValueError, match="missing fields"):
        abi.encode(abi.Op.ATTN_PARTIAL, 0, [], -1, 0, request=0)
    with pytest.raises(KeyError, match="has no field"):
        abi.encode(abi.Op.O_PROJ, 0, [], -1, 0, row0=0, rows=16, batch0=0, batch_rows=0, bogus=1)
    with pytest.raises(ValueError, match="at most 2 waits"):
        abi.encode(abi.Op.END, 0, [(0, 1)] * 3, -1, 0)


def test_unused_waits_are_no_barrier():
    words = abi.encode(abi.Op.ROUTER_TOPK, 1, [(4, 1)], abi.NO_BARRIER, 0, down_barrier=7, down_tiles=2)
    assert words[abi.field_index(abi.Op.ROUTER_TOPK, "wait1_barrier")] == abi.NO_BARRIER
    assert words[abi.field_index(abi.Op.ROUTER_TOPK, "load_wait_barrier")] == abi.NO_BARRIER


def test_the_kernel_is_compiled_for_the_north_mini_code_config():
    config = json.loads((FULL_CONFIG / "config.json").read_text())
    dims = ref.ModelDims.from_config(config)
    assert layout.model_mismatches(dims, config["intermediate_size"], config["prefix_dense_intermediate_size"]) == []
    tiny = json.loads((TINY_CONFIG / "config.json").read_text())
    reasons = layout.model_mismatches(ref.ModelDims.from_config(tiny), tiny["intermediate_size"],
                                      tiny["prefix_dense_intermediate_size"])
    assert "hidden=64 (the kernel is compiled for 2048)" in reasons and len(reasons) == 8


def test_a_model_without_dense_layers_fits_whatever_its_dense_width():
    """The dense FFN width is checked only where a dense layer uses it: attention_bench's MoE-only model
    (whose weights carry no dense width, 0) fits, a model with a dense layer of another width does not."""
    from benchmarks import attention_bench

    config = json.loads((FULL_CONFIG / "config.json").read_text())
    dims = ref.ModelDims.from_config(config)
    moe_only = attention_bench.attention_dims(dims)
    assert not any(moe_only.dense)
    assert layout.model_mismatches(moe_only, config["intermediate_size"], 0) == []
    assert layout.model_mismatches(dims, config["intermediate_size"], 0) == [
        f"dense_intermediate=0 (the kernel is compiled for {config['prefix_dense_intermediate_size']})"]


def test_every_stage_is_one_bulk_copy_of_whole_rows():
    for name, rows in layout.compiled_stage_rows().items():
        k = {"qkv": 2048, "o": 4096, "router": 2048, "dense_up": 2048, "dense_down": 3072, "moe_up": 2048,
             "moe_down": 768}[name]
        assert rows * k * 2 <= abi.KERNEL["stage_bytes"] < 2 * rows * k * 2 or rows == 16, name
    assert f"constexpr int kQkvStageRows = {layout.rows_per_stage(2048)};" in abi.render_header()


def test_built_extension_reports_this_abi_version():
    _C = pytest.importorskip("vllm_megakernel._C", reason="extension not built (no nvcc at install time)")
    assert _C.build_info()["abi_version"] == abi.ABI_VERSION

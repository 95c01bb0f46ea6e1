"""One source of truth for the ABI: csrc/abi.h is exactly what abi.py generates; descriptors round-trip."""

import pytest

from conftest import REPO
from vllm_megakernel.megakernel import abi


def test_committed_header_is_generated_from_abi_py():
    committed = (REPO / "csrc" / "abi.h").read_text()
    assert committed == abi.render_header(), (
        "csrc/abi.h is stale: run python -m vllm_megakernel.megakernel.abi --write csrc/abi.h"
    )


def test_descriptor_round_trip_for_every_opcode():
    for op in abi.Op:
        fields = {name: 100 + i for i, name in enumerate(abi.OP_FIELDS[op])}
        words = abi.encode(op, 7, [(3, 5), (9, 2)], 11, 42, **fields)
        assert len(words) == abi.TASK_WORDS
        got = abi.decode(words)
        assert got["opcode"] == op and got["layer"] == 7 and got["task_index"] == 42
        assert (got["wait0_barrier"], got["wait0_count"], got["wait1_barrier"], got["wait1_count"]) == (3, 5, 9, 2)
        assert got["signal_barrier"] == 11
        assert all(got[k] == v for k, v in fields.items())


def test_missing_or_unknown_fields_are_refused():
    with pytest.raises(ValueError, match="missing fields"):
        abi.encode(abi.Op.ATTN_PARTIAL, 0, [], -1, 0, request=0, kv_head=0, split=0)
    with pytest.raises(KeyError, match="has no field"):
        abi.encode(abi.Op.O_PROJ, 0, [], -1, 0, col_tile=0, bogus=1)
    with pytest.raises(ValueError, match="at most 2 waits"):
        abi.encode(abi.Op.END, 0, [(0, 1)] * 3, -1, 0)


def test_unused_waits_are_no_barrier():
    words = abi.encode(abi.Op.ROUTER, 1, [(4, 1)], abi.NO_BARRIER, 0)
    assert words[abi.field_index(abi.Op.ROUTER, "wait1_barrier")] == abi.NO_BARRIER


def test_built_extension_reports_this_abi_version():
    _C = pytest.importorskip("vllm_megakernel._C", reason="extension not built (no nvcc at install time)")
    assert _C.build_info()["abi_version"] == abi.ABI_VERSION

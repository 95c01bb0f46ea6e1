"""The megakernel ABI: opcodes, task-descriptor fields, the error record. The ONE source of truth.

Python builds descriptors with these names; ``csrc/abi.h`` is generated from this file
(``python -m vllm_megakernel.megakernel.abi --write csrc/abi.h``) and a test fails when the committed header
and this file disagree, so the CUDA side can never drift from the host side.

A task is ``TASK_WORDS`` int32 words. Words 0..7 are the same for every opcode (the header: what to wait
for, what to signal, which task this is); words 8.. are named per opcode. Each wait is ``(barrier, count)``:
the task starts once ``barriers[barrier] >= count``; ``signal`` is the barrier the task increments by one
when its outputs are visible. ``NO_BARRIER`` (-1) disables a wait or the signal.
"""

from __future__ import annotations

import argparse
import enum
from pathlib import Path

ABI_VERSION = 2
TASK_WORDS = 32
NO_BARRIER = -1


class Op(enum.IntEnum):
    END = 0  # terminates an SM's task list
    EMBED_RMSNORM = 1  # layer 0: x = embed[ids]; hn = rmsnorm(x) * w
    ADD_RMSNORM = 2  # layer l > 0: x = (x + o_out) + mlp_out; hn = rmsnorm(x) * w
    FINAL_NORM = 3  # after the last layer: x = (x + o_out) + mlp_out; out = rmsnorm(x) * w_final
    QKV_ROPE = 4  # one head of [q;k;v] = hn @ Wqkv^T, RoPE if the layer has it; q -> qbuf, k/v -> paged cache
    ATTN_PARTIAL = 5  # one (request, kv head, split) slice of paged attention -> partial out + log-sum-exp
    ATTN_COMBINE = 6  # merges the splits of one (request, kv head) -> attn_out
    O_PROJ = 7  # one column tile of o_out = attn_out @ Wo^T
    DENSE_UPGATE = 8  # one column tile of act = silu(hn @ Wg^T) * (hn @ Wu^T), dense prefix layer
    DENSE_DOWN = 9  # one column tile of mlp_out = act @ Wd^T, dense prefix layer
    ROUTER = 10  # logits = hn @ Wr^T, sigmoid, top-k, then the per-layer expert work list (route)
    MOE_UPGATE = 11  # one (expert slot, column tile) of act rows of the slot's tokens; empty slot: no-op
    MOE_DOWN = 12  # one (expert slot, column tile) of expert_out rows; empty slot: no-op
    MOE_COMBINE = 13  # one column tile of mlp_out[b] = sum_k weight[b, k] * expert_out[b, k]


HEADER_FIELDS = (
    "opcode",
    "layer",
    "wait0_barrier",
    "wait0_count",
    "wait1_barrier",
    "wait1_count",
    "signal_barrier",
    "task_index",  # position in the whole schedule; named in error records
)

# Op-specific fields, in word order after the header.
OP_FIELDS: dict[Op, tuple[str, ...]] = {
    Op.END: (),
    Op.EMBED_RMSNORM: (),
    Op.ADD_RMSNORM: (),
    Op.FINAL_NORM: (),
    Op.QKV_ROPE: ("head",),  # 0..Hq-1 query heads, Hq..Hq+Hkv-1 keys, then values
    Op.ATTN_PARTIAL: ("request", "kv_head", "split", "num_splits"),
    Op.ATTN_COMBINE: ("request", "kv_head", "num_splits"),
    Op.O_PROJ: ("col_tile",),
    Op.DENSE_UPGATE: ("col_tile",),
    Op.DENSE_DOWN: ("col_tile",),
    Op.ROUTER: (),
    Op.MOE_UPGATE: ("slot", "col_tile"),
    Op.MOE_DOWN: ("slot", "col_tile"),
    Op.MOE_COMBINE: ("col_tile",),
}

# What a stalled wait leaves behind (int32 words) before the kernel exits; Python raises naming them.
ERROR_FIELDS = (
    "flag",  # 0 = no error; 1 = a wait timed out
    "sm",
    "task_index",
    "opcode",
    "layer",
    "barrier",
    "expected",
    "seen",
)

# The step table: one int64 word per field, built by the host once per (padded batch, buffer addresses) and
# read by every task. Pointers are device addresses; fields marked (f64) hold a double's bit pattern.
STEP_FIELDS = (
    "batch", "hidden", "num_heads", "num_kv_heads", "head_dim", "num_experts", "top_k",
    "moe_intermediate", "dense_intermediate", "norm_topk_prob",
    "eps_f64", "rope_theta_f64",
    "sliding_window", "tile_n", "attn_splits", "num_slots", "block_size", "timeout_ns",
    # model-wide weights
    "embed", "final_norm",
    # per-step inputs from vLLM's persistent buffers: int32 ids, int64 positions, int32 seq_lens
    "input_ids", "positions", "seq_lens",
    # workspace (bf16 unless noted): x, hn, o, mlp, out [B, H]; q [B, Hq, D]; attn [B, Hq*D];
    # opart f32 [B, Hkv, S, G, D]; lse f32 [B, Hkv, S, G]; dact [B, dense_I]; act [B*K, I];
    # eout [B*K, H]; topk_w f32 [B, K]; route int32 [1 + 2*slots + slots*B]
    "x", "hn", "q", "opart", "lse", "attn", "o", "mlp", "out", "dact", "act", "eout", "topk_w", "route",
    # optional (0 = off): int32 [num_layers, B, K], every MoE layer's chosen experts (accuracy tooling)
    "route_log",
    # optional (0 = off): int64 [num_tasks, len(TRACE_FIELDS)], per task where and when it ran (profiling)
    "trace",
)

# One trace record per task (globaltimer nanoseconds): the SM, when its first wait began, when its body
# began (all waits satisfied), when its outputs were fenced (just before it signalled).
TRACE_FIELDS = ("sm", "wait_start_ns", "run_start_ns", "end_ns")

# The layer table: one row of int64 words per layer. The KV cache is vLLM's FlashAttention layout
# (num_blocks, 2, block_size, num_kv_heads, head_dim) with strides in elements (head_dim is contiguous);
# block_table / slot_mapping are the layer's KV-cache group's (int32 / int64).
LAYER_FIELDS = (
    "dense", "sliding", "rope",
    "norm_w", "qkv_w", "o_w", "gate_up_w", "down_w", "router_w", "w13", "w2",
    "kv_cache", "kv_stride_block", "kv_stride_kv", "kv_stride_token", "kv_stride_head",
    "block_table", "block_table_stride", "slot_mapping",
)

for _op in Op:
    assert _op in OP_FIELDS, f"{_op.name} has no field list"
    assert len(HEADER_FIELDS) + len(OP_FIELDS[_op]) <= TASK_WORDS, _op.name


def field_index(op: Op, name: str) -> int:
    """Word index of a header field or of one of ``op``'s own fields."""
    if name in HEADER_FIELDS:
        return HEADER_FIELDS.index(name)
    try:
        return len(HEADER_FIELDS) + OP_FIELDS[op].index(name)
    except ValueError:
        raise KeyError(f"{op.name} has no field {name!r}; it has {HEADER_FIELDS + OP_FIELDS[op]}") from None


def encode(op: Op, layer: int, waits: list[tuple[int, int]], signal: int, task_index: int,
           **fields: int) -> list[int]:
    """One descriptor as TASK_WORDS ints; unknown or missing op fields raise."""
    if len(waits) > 2:
        raise ValueError(f"{op.name}: at most 2 waits, got {len(waits)}")
    missing = set(OP_FIELDS[op]) - set(fields)
    if missing:
        raise ValueError(f"{op.name}: missing fields {sorted(missing)}")
    words = [0] * TASK_WORDS
    words[0] = int(op)
    words[1] = layer
    padded = list(waits) + [(NO_BARRIER, 0)] * (2 - len(waits))
    words[2], words[3] = padded[0]
    words[4], words[5] = padded[1]
    words[6] = signal
    words[7] = task_index
    for name, value in fields.items():
        words[field_index(op, name)] = int(value)
    return words


def decode(words: list[int]) -> dict[str, int]:
    op = Op(words[0])
    names = HEADER_FIELDS + OP_FIELDS[op]
    return {name: int(words[i]) for i, name in enumerate(names)}


def render_header() -> str:
    lines = [
        "// GENERATED by `python -m vllm_megakernel.megakernel.abi --write csrc/abi.h` from",
        "// vllm_megakernel/megakernel/abi.py, the single source of the megakernel ABI. Do not edit by hand:",
        "// tests/cpu/test_abi.py fails when this file and abi.py disagree.",
        "#pragma once",
        "",
        "namespace vllm_megakernel::abi {",
        "",
        f"constexpr int kAbiVersion = {ABI_VERSION};",
        f"constexpr int kTaskWords = {TASK_WORDS};",
        f"constexpr int kNoBarrier = {NO_BARRIER};",
        "",
        "enum Op : int {",
    ]
    lines += [f"  OP_{op.name} = {int(op)}," for op in Op]
    lines += ["};", "", "// Header words, common to every opcode."]
    lines += [f"constexpr int F_{name.upper()} = {i};" for i, name in enumerate(HEADER_FIELDS)]
    for op in Op:
        if OP_FIELDS[op]:
            lines.append(f"// {op.name}")
            lines += [f"constexpr int F_{op.name}_{name.upper()} = {field_index(op, name)};"
                      for name in OP_FIELDS[op]]
    lines += ["", "// Step table words (int64; *_F64 hold a double's bits)."]
    lines += [f"constexpr int S_{name.upper()} = {i};" for i, name in enumerate(STEP_FIELDS)]
    lines += [f"constexpr int kStepWords = {len(STEP_FIELDS)};", "", "// Layer table words (int64)."]
    lines += [f"constexpr int L_{name.upper()} = {i};" for i, name in enumerate(LAYER_FIELDS)]
    lines += [f"constexpr int kLayerWords = {len(LAYER_FIELDS)};"]
    lines += ["", "// Error record words."]
    lines += [f"constexpr int E_{name.upper()} = {i};" for i, name in enumerate(ERROR_FIELDS)]
    lines += [f"constexpr int kErrorWords = {len(ERROR_FIELDS)};", "", "// Trace record words (int64)."]
    lines += [f"constexpr int T_{name.upper()} = {i};" for i, name in enumerate(TRACE_FIELDS)]
    lines += [f"constexpr int kTraceWords = {len(TRACE_FIELDS)};", "", "}  // namespace vllm_megakernel::abi", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="print or write csrc/abi.h")
    parser.add_argument("--write", type=Path, help="write the header here instead of printing it")
    args = parser.parse_args(argv)
    text = render_header()
    if args.write:
        args.write.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()

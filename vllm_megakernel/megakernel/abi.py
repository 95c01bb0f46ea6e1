"""The megakernel ABI: opcodes, task-descriptor fields, tables, kernel geometry. The ONE source of truth.

Python builds descriptors with these names; ``csrc/abi.h`` is generated from this file
(``python -m vllm_megakernel.megakernel.abi --write csrc/abi.h``) and a test fails when the committed header
and this file disagree, so the CUDA side can never drift from the host side.

A task is ``TASK_WORDS`` int32 words. Words 0..9 are the same for every opcode (the header: what to wait
for, what to signal, which task this is, what the producer waits for); words 10.. are named per opcode.
Each wait is ``(barrier, count)``: the task starts once ``barriers[barrier] >= count``; ``signal`` is the barrier the task increments by one
when its outputs are visible. ``NO_BARRIER`` (-1) disables a wait or the signal.

Besides the descriptor layout this file fixes what the kernel is compiled for: ``MODEL`` (the model shape
the tile loops are unrolled for; other shapes are refused on the host) and ``KERNEL`` (block geometry and
pipeline sizes). Tile shapes and buffer layouts derived from them live in :mod:`.layout`, which also
renders its compile-time part into the header.
"""

from __future__ import annotations

import argparse
import enum
from pathlib import Path

ABI_VERSION = 20
TASK_WORDS = 32
NO_BARRIER = -1
# A stall record's barrier when the wait that timed out was a producer's poll of a posted route word
# (StepShape.posted_routing): its expected is the slot, its seen the layer's posted slot count (-1: not posted)
POSTED_ROUTE_WAIT = -2
# ... and when it was the top-k's poll of its layer's posted score keys (StepShape.posted_scores): its expected
# is the batch row, its seen how many of the row's keys were posted
POSTED_SCORE_WAIT = -3


class Op(enum.IntEnum):
    END = 0  # terminates an SM's task list
    NORM = 1  # rows of x_l = residual (embedding on layer 0), hn = rmsnorm(x_l); final=1: out = final norm;
    #           moe=1: the previous layer's MoE combine folded in (its mlp rows from expert_out and topk_w)
    QKV_ROPE = 2  # rows of [q;k;v] = hn @ Wqkv^T, RoPE where the layer has it; q -> qbuf, k/v -> paged cache
    ROUTER = 3  # expert rows of scores = sigmoid(hn @ Wr^T)
    ROUTER_TOPK = 4  # top-k of the layer's scores per row, their weights, and the expert work list (route)
    ATTN_PARTIAL = 5  # one (request, split) of paged attention over every KV head -> partial out + lse
    ATTN_COMBINE = 6  # merges the splits of one request's heads [head0, head0 + heads) -> attn_out
    O_PROJ = 7  # rows of o_out = attn_out @ Wo^T
    DENSE_UPGATE = 8  # columns of dact = silu(hn @ Wg^T) * (hn @ Wu^T), dense prefix layer
    DENSE_DOWN = 9  # rows of mlp_out = dact @ Wd^T, dense prefix layer
    MOE_UPGATE = 10  # columns of act for the tokens of one expert slot; a slot past num_active: skipped
    MOE_DOWN = 11  # rows of expert_out for the tokens of one expert slot; a slot past num_active: skipped
    MOE_COMBINE = 12  # columns of mlp_out[b] = sum_k weight[b, k] * expert_out[b, k]


HEADER_FIELDS = (
    "opcode",
    "layer",
    "wait0_barrier",
    "wait0_count",
    "wait1_barrier",
    "wait1_count",
    "signal_barrier",
    "task_index",  # position in the whole schedule; named in error records
    # the barrier the producer warp waits on before issuing the loads that depend on this step's data (an
    # expert's weights: the layer's routing; the K/V tile holding the new token: the layer's qkv)
    "load_wait_barrier",
    "load_wait_count",
)

# Op-specific fields, in word order after the header. NORM: ``row_warps`` consumer warps share each row (1,
# a task of up to 8 rows, or 8, a task of one row; csrc NormOp has no other form); ``moe`` = 1 (only with 8
# warps a row): the previous layer is a MoE layer whose MOE_COMBINE wave is folded into this norm
# (StepShape.combine_in_norm): each row's mlp vectors are summed from expert_out and topk_w as MOE_COMBINE
# would (same order, fp32, rounded once) instead of read from mlp, which nothing writes then. QKV_ROPE:
# ``batch_rows`` > 0: the task computes only batch rows [batch0, batch0 + batch_rows) (StepShape.
# qkv_batch_split; never with ``norm``); 0: every row. QKV_ROPE, ROUTER and DENSE_UPGATE: ``norm`` = 1: the
# task folds the layer's RMSNorm into its activation load (reads the residual stream, not hn); ``write_x`` /
# ``write_hn`` = 1 on the one task of the wave that also stores x_l / hn for the rest of the layer. O_PROJ:
# ``batch0`` / ``batch_rows`` as QKV_ROPE's (StepShape.o_batch_split).
#
# ``claim`` (expert tasks): NO_BARRIER, or the barrier word that counts the claims of the task's wave. With
# a counter, the task is a place in its SM's list, not a fixed tile: the producer takes the next number n
# from the counter and runs the wave's n-th task instead (tile n % tiles of slot n / tiles, in the order
# the host numbered them), rewriting the slot, the first column / row, the per-slot barrier (the up/gate
# task's signal, the down task's first wait; a layer's per-slot barriers are consecutive words) and the
# task index. The wave's tasks stay the same set, so every barrier target holds; only which SM runs which
# changes: an SM that reaches its expert tasks early takes more of them, starting with the slots routed
# to, and one that arrives late finds the empty slots' tasks left.
#
# Routed descriptors (``ROUTED_OPS``, the expert tasks): their last words are not written by the host. The
# producer warp completes them from the layer's routing before the consumers see the descriptor (after its
# claim, when the task claims, and its wait on the routing): ``expert``, ``count`` (the slot's (token * K +
# k) rows) and, when count <= ROUTED_PAIR_WORDS, the rows themselves in ``pair0``... (ascending). Neither
# side then reads the route buffer again: the producer's one round trip for these words replaces two or
# three on each side. A task whose slot is past the layer's routed count (a dead slot: fewer distinct
# experts than slots) is skipped: the producer publishes nothing for it and goes on to its next place, so
# it costs no descriptor, consumer barrier, fence or signal. Its signal is made up elsewhere where a live
# task waits on it: ROUTER_TOPK's ``down_barrier`` gets ``down_tiles`` for every dead slot from the top-k's
# signaller (the down wave's barrier, which the MoE combine -- or with StepShape.combine_in_norm the next
# NORM -- waits on in full); a dead slot's up/gate
# barrier is waited on only by that slot's down tasks, skipped too, and stays short of its target.
ROUTED_PAIR_WORDS = 16
ROUTED_FIELDS = ("expert", "count") + tuple(f"pair{i}" for i in range(ROUTED_PAIR_WORDS))
OP_FIELDS: dict[Op, tuple[str, ...]] = {
    Op.END: (),
    Op.NORM: ("row0", "rows", "final", "moe", "row_warps"),
    Op.QKV_ROPE: ("row0", "rows", "norm", "write_x", "batch0", "batch_rows"),
    Op.ROUTER: ("row0", "rows", "norm", "write_hn"),
    Op.ROUTER_TOPK: ("down_barrier", "down_tiles"),
    Op.ATTN_PARTIAL: ("request", "split"),
    Op.ATTN_COMBINE: ("request", "head0", "heads"),
    Op.O_PROJ: ("row0", "rows", "batch0", "batch_rows"),
    Op.DENSE_UPGATE: ("col0", "cols", "norm"),
    Op.DENSE_DOWN: ("row0", "rows"),
    Op.MOE_UPGATE: ("slot", "col0", "cols", "claim") + ROUTED_FIELDS,
    Op.MOE_DOWN: ("slot", "row0", "rows", "claim") + ROUTED_FIELDS,
    Op.MOE_COMBINE: ("col0", "cols"),
}

ROUTED_OPS = frozenset({Op.MOE_UPGATE, Op.MOE_DOWN})

# Opcodes whose tasks may have nothing to do on a step's live data (an attention split past the end of its
# request's visible keys). The op struct declares `has_work(step, task)`, read only from what the host wrote
# before the launch; a task without work skips its input waits (it reads and writes nothing) and still
# signals. A queued task that waits on inputs holds up every task behind it on its SM, so an empty one
# should not. The simulator does not let later tasks on the SM lean on such a task's waits.
WAITS_ONLY_IF_WORK = frozenset({Op.ATTN_PARTIAL})

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
# read by every task. Pointers are device addresses; fields marked (f64) hold a double's bit pattern. The
# workspace buffers (layout.workspace_spec gives each one's shape and dtype) follow the scalars.
STEP_FIELDS = (
    "batch", "num_slots", "block_size", "sliding_window", "attn_splits", "attn_min_tiles",
    # layout.attn_split_tiles' cap on live splits per request (0: off) and the longest split it allows
    "attn_live_splits", "attn_max_tiles",
    "norm_topk_prob",
    "eps_f64", "rope_theta_f64", "timeout_ns",
    # 1: experts are drawn uniformly at random instead of by the router, with weight 1 (vLLM's
    # VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random, for benchmarks); reference.uniform_experts
    "uniform_routing",
    # 1: every expert task's producer chooses the layer's experts itself from the router's scores (the same
    # top-k as ROUTER_TOPK, on one warp) instead of waiting for the top-k's work list (schedule.StepShape's
    # local_routing; batches up to KERNEL["local_routing_max_batch"])
    "local_routing",
    # 1: the top-k posts each slot of its layer's work list as one 64-bit word that carries its own "posted"
    # bit (ROUTE_POST), and every expert task's producer polls its slot's word instead of waiting on the
    # top-k's barrier and then reading the route buffer (schedule.StepShape's posted_routing; batches up to
    # KERNEL["posted_routing_max_batch"])
    "posted_routing",
    # how many of the producer's stage-ring buffers may be in flight (issued, not landed) at once, 1 to
    # KERNEL["stages"] (the whole ring: no cap); schedule.StepShape's stages_in_flight
    "stages_in_flight",
    # 1: a producer that first reaches a MoE layer's routed places asks L2 for its SM's O projection rows of the
    # layer before it waits on the routing (schedule.StepShape's o_prefetch)
    "o_prefetch",
    # route buffer offsets (int32 words): num_active at 0, then layout.route_offsets
    "route_expert_off", "route_count_off", "route_rows_off",
    # the posted route words (uint64 [num_layers][1 + num_slots]: the layer's routed slot count, then each
    # slot's; ROUTE_POST), in the step's barrier array, which the host zeroes before every launch
    "route_posts",
    # the posted score keys (uint32 [num_layers][batch][num_experts], layout.score_post_words; 0: none, the
    # step's posted_scores off): each ROUTER task also stores its scores as the top-k's ranking keys (a score's
    # bits + 2, 1 for a NaN, so never 0), and the top-k polls its rows' keys instead of waiting on the router
    # wave's barrier (schedule.StepShape's posted_scores); in the step's barrier array, after the route words
    "score_posts",
    # model-wide weights
    "embed", "final_norm",
    # per-step inputs from vLLM's persistent buffers: int32 ids, int64 positions, int32 seq_lens
    "input_ids", "positions", "seq_lens",
    # workspace
    "x", "hn", "q", "opart", "lse", "attn", "o", "mlp", "out", "scores", "topk_w", "route", "dact", "act",
    "eout",
    # optional (0 = off): int32 [num_layers, B, K], every MoE layer's chosen experts (accuracy tooling)
    "route_log",
    # optional (0 = off): int64 [num_tasks, len(TRACE_FIELDS)], per task where and when it ran (profiling)
    "trace",
)

# One trace record per task (globaltimer nanoseconds): the SM, when its first wait began, when its body
# began (all waits satisfied), when its inputs (activation rows) were staged and when its last weight or
# K/V stage was consumed (ROUTER_TOPK: when every row's experts were chosen and when the work list's slots
# were numbered; 0 for other ops without stages), when every consumer had finished its body, when its
# outputs were fenced (by the signaller, just before it signalled), and the physical SM (%smid) the
# block ran on: "sm" is the block, the schedule's SM; which physical SM a block lands on is the hardware's
# choice, and batch 1's speed differs between processes with the routing chain (PERF_LOG #93).
TRACE_FIELDS = ("sm", "wait_start_ns", "run_start_ns", "inputs_ns", "stages_ns", "compute_end_ns", "end_ns",
                "smid")

# The layer table: one row of int64 words per layer. The KV cache is vLLM's FlashAttention layout
# (num_blocks, 2, block_size, num_kv_heads, head_dim) with strides in elements (head_dim is contiguous);
# block_table / slot_mapping are the layer's KV-cache group's (int32 / int64).
LAYER_FIELDS = (
    "dense", "sliding", "rope",
    "norm_w", "qkv_w", "o_w", "gate_up_w", "down_w", "router_w", "w13", "w2",
    "kv_cache", "kv_stride_block", "kv_stride_kv", "kv_stride_token", "kv_stride_head",
    "block_table", "block_table_stride", "slot_mapping",
)

# The model shape the kernel is compiled for (North Mini Code): its tile loops are unrolled over these.
# configs/north-mini-code/config.json is checked against it by a test; other shapes run on stock vLLM.
MODEL = {
    "hidden": 2048,
    "num_heads": 32,
    "num_kv_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "top_k": 8,
    "moe_intermediate": 768,
    "dense_intermediate": 3072,
}

# Block geometry and pipeline sizes. One producer warp streams weight and K/V tiles into a ring of
# ``stages`` buffers of ``stage_bytes`` with bulk copies; ``consumer_warps`` warps compute on them.
KERNEL = {
    "consumer_warps": 8,
    "stages": 5,
    "stage_bytes": 32768,
    "desc_slots": 8,  # descriptors the producer may run ahead of the consumers by
    # GEMM partial sums: fp32 [consumer_warps][rows of a task][batch rows padded to 16]
    "partial_floats": 12288,
    # batches up to this size keep their activation rows in registers (two 8-row halves of an mma tile)
    # and fold the RMSNorm into the tasks that read it; larger ones run a NORM wave and reload per stage
    "register_batch": 16,
    "attn_tile_tokens": 16,  # tokens per attention stage (one K/V tile of every KV head)
    "max_batch": 64,  # the most rows a step may have (the top-k's shared scratch is sized for it)
    "max_attn_splits": 128,  # the most splits per request (the combine's shared scratch is sized for it)
    # the most rows a step with local routing may have (the producer's routing scratch is sized for it)
    "local_routing_max_batch": 8,
    # the most rows a step with posted routing may have (a slot's rows fit its posted word, ROUTE_POST)
    "posted_routing_max_batch": 8,
}

# One posted route word (StepShape.posted_routing): zero until the top-k stores it (the host zeroes the
# barrier array that holds them before every launch), then bit ``posted`` set and, for a slot: its expert in
# the low ``expert_bits``, its row count in the next ``count_bits``, then its (token * K + k) rows ascending,
# ``pair_bits`` each; for a layer's first word: its routed slot count in the low bits. One 64-bit store, so a
# reader that sees the bit sees the whole word (naturally aligned 64-bit accesses are single-copy atomic).
ROUTE_POST = {"expert_bits": 7, "count_bits": 4, "pair_bits": 6, "posted_bit": 63}

for _op in Op:
    assert _op in OP_FIELDS, f"{_op.name} has no field list"
    assert len(HEADER_FIELDS) + len(OP_FIELDS[_op]) <= TASK_WORDS, _op.name
# every routed opcode has the same word layout: slot, its tile's first column / row, the tile's width,
# claim, then the routed words (the producer completes and claims them without knowing which one it holds)
ROUTED_LEAD = ("slot", "first", "width", "claim")  # the first two are named per opcode: col0 / row0, cols / rows
for _op in ROUTED_OPS:
    assert OP_FIELDS[_op][:4:3] == ("slot", "claim") and OP_FIELDS[_op][4:] == ROUTED_FIELDS, _op.name
assert ROUTED_PAIR_WORDS >= KERNEL["register_batch"], "a slot's rows at the register batch fit the descriptor"
_post_rows = KERNEL["posted_routing_max_batch"]
assert MODEL["num_experts"] <= 1 << ROUTE_POST["expert_bits"] and _post_rows < 1 << ROUTE_POST["count_bits"]
assert _post_rows * MODEL["top_k"] <= 1 << ROUTE_POST["pair_bits"], "a pair index fits its bits"
assert ROUTE_POST["expert_bits"] + ROUTE_POST["count_bits"] + _post_rows * ROUTE_POST["pair_bits"] <= \
    ROUTE_POST["posted_bit"], "a slot's word holds all its rows below the posted bit"


def pack_route_post(expert: int, rows: list[int]) -> int:
    """A slot's posted word (ROUTE_POST) as an unsigned 64-bit value: what the top-k stores."""
    b = ROUTE_POST
    word = 1 << b["posted_bit"] | expert | len(rows) << b["expert_bits"]
    for j, pair in enumerate(rows):
        word |= pair << (b["expert_bits"] + b["count_bits"] + j * b["pair_bits"])
    return word


def unpack_route_post(word: int) -> tuple[int, list[int]] | None:
    """(expert, rows) of a slot's posted word, or None while it is not posted."""
    b = ROUTE_POST
    word &= (1 << 64) - 1
    if not word >> b["posted_bit"] & 1:
        return None
    count = word >> b["expert_bits"] & ((1 << b["count_bits"]) - 1)
    first = b["expert_bits"] + b["count_bits"]
    mask = (1 << b["pair_bits"]) - 1
    return word & ((1 << b["expert_bits"]) - 1), [word >> (first + j * b["pair_bits"]) & mask for j in range(count)]


def field_index(op: Op, name: str) -> int:
    """Word index of a header field or of one of ``op``'s own fields."""
    if name in HEADER_FIELDS:
        return HEADER_FIELDS.index(name)
    try:
        return len(HEADER_FIELDS) + OP_FIELDS[op].index(name)
    except ValueError:
        raise KeyError(f"{op.name} has no field {name!r}; it has {HEADER_FIELDS + OP_FIELDS[op]}") from None


def encode(op: Op, layer: int, waits: list[tuple[int, int]], signal: int, task_index: int,
           load_wait: tuple[int, int] = (NO_BARRIER, 0), **fields: int) -> list[int]:
    """One descriptor as TASK_WORDS ints; unknown or missing op fields raise."""
    if len(waits) > 2:
        raise ValueError(f"{op.name}: at most 2 waits, got {len(waits)}")
    missing = set(OP_FIELDS[op]) - set(fields) - (set(ROUTED_FIELDS) if op in ROUTED_OPS else set())
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
    words[8], words[9] = load_wait
    for name, value in fields.items():
        words[field_index(op, name)] = int(value)
    return words


def decode(words: list[int]) -> dict[str, int]:
    op = Op(words[0])
    names = HEADER_FIELDS + OP_FIELDS[op]
    return {name: int(words[i]) for i, name in enumerate(names)}


def render_header() -> str:
    from vllm_megakernel.megakernel import layout

    lines = [
        "// GENERATED by `python -m vllm_megakernel.megakernel.abi --write csrc/abi.h` from",
        "// vllm_megakernel/megakernel/abi.py and layout.py, the single source of the megakernel ABI. Do not edit",
        "// by hand: tests/cpu/test_abi.py fails when this file and the Python side disagree.",
        "#pragma once",
        "",
        "namespace vllm_megakernel::abi {",
        "",
        f"constexpr int kAbiVersion = {ABI_VERSION};",
        f"constexpr int kTaskWords = {TASK_WORDS};",
        f"constexpr int kNoBarrier = {NO_BARRIER};",
        f"constexpr int kPostedRouteWait = {POSTED_ROUTE_WAIT};",
        f"constexpr int kPostedScoreWait = {POSTED_SCORE_WAIT};",
        "",
        "enum Op : int {",
    ]
    lines += [f"  OP_{op.name} = {int(op)}," for op in Op]
    lines += ["};", "", "// Opcodes whose tasks skip their input waits when has_work() says they have nothing to do."]
    lines += ["constexpr bool waits_only_if_work(int op) {",
              "  return " + " || ".join(f"op == OP_{op.name}" for op in sorted(WAITS_ONLY_IF_WORK)) + ";", "}"]
    lines += ["", "// Opcodes whose descriptors the producer completes from the layer's routing (abi.ROUTED_OPS)."]
    lines += ["constexpr bool routed_descriptor(int op) {",
              "  return " + " || ".join(f"op == OP_{op.name}" for op in sorted(ROUTED_OPS)) + ";", "}"]
    lines += [f"constexpr int kRoutedPairWords = {ROUTED_PAIR_WORDS};"]
    lines += [f"constexpr int F_ROUTED_{name.upper()} = {len(HEADER_FIELDS) + i};"
              for i, name in enumerate(ROUTED_LEAD + ROUTED_FIELDS[:3])]
    lines += ["", "// Header words, common to every opcode."]
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
    lines += [f"constexpr int kTraceWords = {len(TRACE_FIELDS)};", ""]
    lines += ["// The model shape the kernel is compiled for (abi.MODEL)."]
    lines += [f"constexpr int k{_camel(name)} = {value};" for name, value in MODEL.items()]
    lines += ["", "// Block geometry and pipeline (abi.KERNEL)."]
    lines += [f"constexpr int k{_camel(name)} = {value};" for name, value in KERNEL.items()]
    lines += ["", "// A posted route word (abi.ROUTE_POST)."]
    lines += [f"constexpr int kPost{_camel(name)} = {value};" for name, value in ROUTE_POST.items()]
    lines += ["", "// Weight rows per pipeline stage of each GEMM (layout.rows_per_stage of its row length)."]
    lines += [f"constexpr int k{_camel(name)}StageRows = {rows};"
              for name, rows in layout.compiled_stage_rows().items()]
    lines += ["", "}  // namespace vllm_megakernel::abi", ""]
    return "\n".join(lines)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


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

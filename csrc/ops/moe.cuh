// MOE_UPGATE, MOE_DOWN, MOE_COMBINE: the routed experts over ROUTER_TOPK's work list.
//
// Rows are (token * K + k) pairs, so every (token, expert) pair owns one row of act and expert_out and no
// two tasks write the same row. Which expert a slot holds is this step's data: the producer waits on the
// layer's routing (the descriptor's load_wait) before it can stream the expert's weights, and both sides
// read the same route words after that wait, so they agree on whether the slot has work at all. An expert
// task whose slot is past num_active loads and computes nothing; it still signals its barrier (the host
// derived the counts from the slot count, not from routing).
//
// Claimed expert tasks (abi.py, the `claim` field): the producer takes the task's number n in its wave
// from the wave's counter and rewrites the descriptor into the wave's n-th task before the consumers see
// it (claimed_word below); consumers and the loop then run it like any other.
#pragma once

#include "gemm.cuh"

namespace vllm_megakernel {

// Whether a descriptor (its words spread over the producer warp's lanes, `word` this lane's) is an expert
// task that takes its tile from a claim counter; that counter's barrier word, else kNoBarrier.
__device__ __forceinline__ int claim_counter(int op, int word) {
  const int field = op == abi::OP_MOE_UPGATE ? abi::F_MOE_UPGATE_CLAIM
                    : op == abi::OP_MOE_DOWN ? abi::F_MOE_DOWN_CLAIM
                                             : -1;
  const int counter = __shfl_sync(0xffffffffu, word, field < 0 ? 0 : field);
  return field < 0 ? abi::kNoBarrier : counter;
}

// This lane's word of the wave's n-th task, from this lane's word of the claiming task (the whole producer
// warp calls it). The host numbers a wave slot-major (n = slot * tiles + tile) with its per-slot barriers
// in consecutive words, and schedule._check_claim_waves holds it to that; so the claiming task's own
// (slot, tile, barrier, index) give the rest.
__device__ __forceinline__ int claimed_word(int op, int word, int n) {
  const bool up = op == abi::OP_MOE_UPGATE;
  const int f_slot = up ? abi::F_MOE_UPGATE_SLOT : abi::F_MOE_DOWN_SLOT;
  const int f_first = up ? abi::F_MOE_UPGATE_COL0 : abi::F_MOE_DOWN_ROW0;
  const int f_width = up ? abi::F_MOE_UPGATE_COLS : abi::F_MOE_DOWN_ROWS;
  const int f_slot_barrier = up ? abi::F_SIGNAL_BARRIER : abi::F_WAIT0_BARRIER;
  const int slot0 = __shfl_sync(0xffffffffu, word, f_slot);
  const int first0 = __shfl_sync(0xffffffffu, word, f_first);
  const int width = __shfl_sync(0xffffffffu, word, f_width);
  const int barrier0 = __shfl_sync(0xffffffffu, word, f_slot_barrier);
  const int index0 = __shfl_sync(0xffffffffu, word, abi::F_TASK_INDEX);
  const int tiles = (up ? abi::kMoeIntermediate : abi::kHidden) / width;
  const int slot = n / tiles, tile = n % tiles;
  const int lane = Role::lane();
  if (lane == f_slot) return slot;
  if (lane == f_first) return tile * width;
  if (lane == f_slot_barrier) return barrier0 == abi::kNoBarrier ? barrier0 : barrier0 - slot0 + slot;
  if (lane == abi::F_TASK_INDEX) return index0 - (slot0 * tiles + first0 / width) + n;
  if (lane == (up ? abi::F_MOE_UPGATE_CLAIM : abi::F_MOE_DOWN_CLAIM)) return abi::kNoBarrier;  // claimed
  return word;
}

struct MoeUpgateOp {
  static constexpr int K = abi::kHidden, RS = abi::kMoeUpStageRows, I = abi::kMoeIntermediate;
  struct Shared {
    float part[abi::kPartialFloats];
  };

  static __device__ bool load(Producer& p, const Task& t) {
    if (!p.load_wait(t)) return false;
    const int slot = t[abi::F_MOE_UPGATE_SLOT];
    if (slot >= p.st.route()[0]) return true;
    const int col0 = t[abi::F_MOE_UPGATE_COL0], cols = t[abi::F_MOE_UPGATE_COLS];
    const bf16* w = t.ly.ptr<const bf16>(abi::L_W13) + (long long)p.st.slot_expert()[slot] * 2 * I * K;
    return load_weight_rows<K, RS>(p, w + (long long)col0 * K, cols) &&
           load_weight_rows<K, RS>(p, w + (long long)(I + col0) * K, cols);
  }

  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    const int slot = t[abi::F_MOE_UPGATE_SLOT];
    if (slot >= c.st.route()[0]) return true;
    const int col0 = t[abi::F_MOE_UPGATE_COL0], cols = t[abi::F_MOE_UPGATE_COLS], R = 2 * cols;
    const int count = c.st.slot_count()[slot], bp = padded_rows(count);
    const int* rows = c.st.slot_rows(slot);
    const GatheredRows src{c.st.ptr<const bf16>(abi::S_HN), K, count, rows, abi::kTopK};
    if (!gemm_task<K, RS>(c, src, count, R, sh.part)) return false;
    bf16* act = c.st.ptr<bf16>(abi::S_ACT) + col0;
    store_silu_mul(c, sh.part, cols, count, bp, [&](int b) { return act + (long long)rows[b] * I; });
    return true;
  }
};

struct MoeDownOp {
  static constexpr int K = abi::kMoeIntermediate, RS = abi::kMoeDownStageRows;
  struct Shared {
    float part[abi::kPartialFloats];
  };

  static __device__ bool load(Producer& p, const Task& t) {
    if (!p.load_wait(t)) return false;
    const int slot = t[abi::F_MOE_DOWN_SLOT];
    if (slot >= p.st.route()[0]) return true;
    const bf16* w = t.ly.ptr<const bf16>(abi::L_W2) +
                    ((long long)p.st.slot_expert()[slot] * abi::kHidden + t[abi::F_MOE_DOWN_ROW0]) * K;
    return load_weight_rows<K, RS>(p, w, t[abi::F_MOE_DOWN_ROWS]);
  }

  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    const int slot = t[abi::F_MOE_DOWN_SLOT];
    if (slot >= c.st.route()[0]) return true;
    const int row0 = t[abi::F_MOE_DOWN_ROW0], R = t[abi::F_MOE_DOWN_ROWS];
    const int count = c.st.slot_count()[slot], bp = padded_rows(count);
    const int* rows = c.st.slot_rows(slot);
    const GatheredRows src{c.st.ptr<const bf16>(abi::S_ACT), K, count, rows, 1};
    if (!gemm_task<K, RS>(c, src, count, R, sh.part)) return false;
    bf16* eout = c.st.ptr<bf16>(abi::S_EOUT) + row0;
    store_rows(c, sh.part, R, count, bp, [&](int b) { return eout + (long long)rows[b] * abi::kHidden; });
    return true;
  }
};

// MOE_COMBINE: columns [col0, col0 + cols) of mlp[b] = sum_k weight[b, k] * expert_out[b * K + k] in fp32.
struct MoeCombineOp {
  struct Shared {};
  static __device__ bool load(Producer&, const Task&) { return true; }
  static __device__ bool compute(Consumer& c, const Task& t, Shared&) {
    const int col0 = t[abi::F_MOE_COMBINE_COL0], vecs = t[abi::F_MOE_COMBINE_COLS] / 8, B = c.st.batch();
    const float* topk_w = c.st.ptr<const float>(abi::S_TOPK_W);
    const bf16* eout = c.st.ptr<const bf16>(abi::S_EOUT);
    bf16* mlp = c.st.mlp(t.layer());
    for (int idx = c.thread; idx < B * vecs; idx += kConsumerThreads) {
      const int b = idx / vecs, col = col0 + (idx % vecs) * 8;
      float acc[8] = {};
      if (c.st.seq_len(b) > 0) {  // padding rows were not routed
        for (int k = 0; k < abi::kTopK; ++k) {
          float e[8];
          const float w = topk_w[b * abi::kTopK + k];
          unpack8(load16(eout + (long long)(b * abi::kTopK + k) * abi::kHidden + col), e);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[j] += w * e[j];
        }
      }
      store16(mlp + (long long)b * abi::kHidden + col, pack8(acc));
    }
    return true;
  }
};

}  // namespace vllm_megakernel

// ROUTER and ROUTER_TOPK: the MoE layer's expert choice, spread over many SMs and then gathered.
//
// ROUTER: expert rows [row0, row0 + rows) of the router GEMM; logits are rounded to bf16 (vLLM's gate is a
// bf16 linear) and scored with sigmoid in fp32 into the scores buffer. In the folded form its first task
// also stores hn for the layer's expert up/gate tasks.
// ROUTER_TOPK: per batch row the k best scores (lowest expert id on ties), their weights (renormalised
// only when the config says so; North Mini Code: no), and the layer's expert work list: each chosen expert
// gets a slot in ascending expert order, with its (token * K + k) rows in ascending order; slots past
// num_active stay empty and the producers skip those slots' expert tasks. Padding rows (seq_len 0) are
// not routed. With the step's uniform_routing set, a row's experts are the first K distinct values of the
// draws j = 0, 1, ... (a hash of layer, the row's position, the row and j, modulo the expert count), with weight 1
// (reference.uniform_experts, which says how this relates to vLLM's uniform_random routing simulation).
// Distinct like a real top-k: an expert's rows never outnumber the batch, which the route buffer's
// per-slot row lists and the GEMMs' register tiles rely on.
#pragma once

#include <math_constants.h>

#include "norm.cuh"

namespace vllm_megakernel {

struct RouterOp {
  static constexpr int K = abi::kHidden, RS = abi::kRouterStageRows;
  struct Shared {
    float part[abi::kPartialFloats];
    NormScratch norm;
  };

  static __device__ bool load(Producer& p, const Task& t) {
    const bf16* w = t.ly.ptr<const bf16>(abi::L_ROUTER_W) + (long long)t[abi::F_ROUTER_ROW0] * K;
    return load_weight_rows<K, RS>(p, w, t[abi::F_ROUTER_ROWS]);
  }

  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    const int row0 = t[abi::F_ROUTER_ROW0], R = t[abi::F_ROUTER_ROWS], B = c.st.batch(), bp = padded_rows(B);
    bf16* store_hn = t[abi::F_ROUTER_WRITE_HN] ? c.st.ptr<bf16>(abi::S_HN) : nullptr;
    if (!hidden_gemm<RS>(c, t, t[abi::F_ROUTER_NORM] != 0, R, sh.part, sh.norm, nullptr, store_hn)) return false;
    float* scores = c.st.ptr<float>(abi::S_SCORES);
    for (int idx = c.thread; idx < R * B; idx += kConsumerThreads) {
      const int r = idx % R, b = idx / R;
      const float logit = round_bf16(sh.part[r * bp + b]);
      scores[b * abi::kNumExperts + row0 + r] = 1.f / (1.f + expf(-logit));
    }
    return true;
  }
};

// MurmurHash3's 32-bit finalizer (reference._fmix32).
__device__ __forceinline__ uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

// reference.uniform_draw: the j-th uniform draw of batch row `row` at `position` on `layer`. The row is in
// the key because the rows of one batch are often at the same position (a sweep's equal prompts): keyed on
// the position alone they would all draw the same experts.
__device__ __forceinline__ int uniform_draw(int layer, long long position, int row, int j) {
  const uint32_t x = (uint32_t)layer * 0x9E3779B1u ^ (uint32_t)position * 0x85EBCA77u ^
                     (uint32_t)j * 0xC2B2AE3Du ^ (uint32_t)row * 0x27D4EB2Fu;
  return (int)(fmix32(x) % (uint32_t)abi::kNumExperts);
}

struct RouterTopkOp {
  static constexpr int E = abi::kNumExperts, K = abi::kTopK, kPerLane = E / 32;
  static_assert(E % 32 == 0, "experts are dealt to lanes");
  struct Shared {
    int chosen[abi::kMaxBatch * abi::kTopK];  // expert of pair (row, k); -1 for padding rows
    int count[abi::kNumExperts];
    int slot[abi::kNumExperts];
    int fill[abi::kNumExperts];  // rows placed so far per expert (the row placement's running offset)
  };

  static __device__ bool load(Producer&, const Task&) { return true; }

  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    const int B = c.st.batch(), layer = t.layer();
    const float* scores = c.st.ptr<const float>(abi::S_SCORES);
    float* topk_w = c.st.ptr<float>(abi::S_TOPK_W);
    int* route_log = c.st.ptr<int>(abi::S_ROUTE_LOG);
    const bool renorm = c.st.i(abi::S_NORM_TOPK_PROB) != 0;
    for (int e = c.thread; e < E; e += kConsumerThreads) sh.count[e] = sh.fill[e] = 0;
    const bool uniform = c.st.i(abi::S_UNIFORM_ROUTING) != 0;
    if (uniform) c.mark_inputs();  // no scores to read
    for (int r = c.warp; r < B && uniform; r += kConsumerWarps) {
      // Lane l holds draw j0 + l; a draw is taken if no earlier lane drew its value and no expert taken
      // from an earlier round is it, in lane order, until the row has K (32 draws almost always do).
      const long long position = c.st.ptr<const long long>(abi::S_POSITIONS)[r];
      int* row = sh.chosen + r * K;
      for (int j0 = 0, found = 0; found < K; j0 += 32) {
        const int e = uniform_draw(layer, position, r, j0 + c.lane);
        bool fresh = (__match_any_sync(0xffffffffu, e) & ((1u << c.lane) - 1)) == 0;
        for (int q = 0; q < found; ++q) fresh &= row[q] != e;
        const unsigned taken = __ballot_sync(0xffffffffu, fresh);
        const int k = found + __popc(taken & ((1u << c.lane) - 1));
        if (fresh && k < K) row[k] = e;
        found += __popc(taken);
        __syncwarp();  // this round's choices are read by the next one
      }
      if (c.lane < K) {
        if (route_log) route_log[((long long)layer * B + r) * K + c.lane] = row[c.lane];
        if (c.st.seq_len(r) == 0) row[c.lane] = -1;  // padding rows are not routed
        topk_w[r * K + c.lane] = 1.f;
      }
    }
    for (int r = c.warp; r < B && !uniform; r += kConsumerWarps) {
      const bool live = c.st.seq_len(r) > 0;  // padding rows are not routed (their weights are unused)
      // Scores are sigmoids, in [0, 1]: their bit patterns order like the values, so a round's arg-max is
      // one warp max-reduction of keys (the bits + 2; 1: a NaN score, chosen after every number; 0: taken)
      // and one min-reduction of the expert ids that hold it (ties: lowest id).
      uint32_t key[kPerLane];
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const float v = scores[r * E + c.lane + 32 * j];
        key[j] = v >= 0.f ? __float_as_uint(v) + 2u : 1u;
      }
      if (r == c.warp) {  // the trace's first mark (the leader's first row): its scores are in registers
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) asm volatile("" ::"r"(key[j]));  // the loads land before the mark
        c.mark_inputs();
      }
      float total = 0.f, mine = 0.f;  // lane k keeps the k-th weight
#pragma unroll 1
      for (int k = 0; k < K; ++k) {
        uint32_t best = 0;
        int best_e = E;
#pragma unroll
        for (int j = 0; j < kPerLane; ++j)
          if (key[j] > best) best = key[j], best_e = c.lane + 32 * j;  // j ascending: ties keep the lower id
        const uint32_t top = __reduce_max_sync(0xffffffffu, best);
        const int e = __reduce_min_sync(0xffffffffu, (unsigned)(best == top ? best_e : E));
        if ((e & 31) == c.lane) key[e >> 5] = 0;  // knocked out for the next round
        const float score = top >= 2u ? __uint_as_float(top - 2u) : CUDART_NAN_F;
        if (c.lane == k) mine = score;
        total += score;
        if (c.lane == 0) {
          sh.chosen[r * K + k] = live ? e : -1;
          if (route_log) route_log[((long long)layer * B + r) * K + k] = e;
        }
      }
      if (c.lane < K) topk_w[r * K + c.lane] = renorm ? mine / total : mine;
    }
    c.mark_stages();  // the trace's second mark: every row's experts chosen (the work list below is the rest)
    consumer_sync();
    for (int p = c.thread; p < B * K; p += kConsumerThreads)
      if (sh.chosen[p] >= 0) atomicAdd(&sh.count[sh.chosen[p]], 1);
    consumer_sync();
    int* slot_expert = c.st.slot_expert();
    int* slot_count = c.st.slot_count();
    if (c.warp == 0) {  // slots in ascending expert order: an exclusive scan of "chosen at all"
      int base = 0;
      for (int e0 = 0; e0 < E; e0 += 32) {
        const int e = e0 + c.lane, n = sh.count[e];
        const unsigned used = __ballot_sync(0xffffffffu, n > 0);
        const int slot = base + __popc(used & ((1u << c.lane) - 1));
        sh.slot[e] = n > 0 ? slot : -1;
        if (n > 0) {
          slot_expert[slot] = e;
          slot_count[slot] = n;
        }
        base += __popc(used);
      }
      if (c.lane == 0) {
        c.st.route()[0] = base;
        c.st.layer_active()[layer] = base;  // the producers' and the signaller's count of this layer's slots
      }
    }
    consumer_sync();
    // Each expert's rows, ascending, in one pass of warp 0 over the pairs 32 at a time: a pair's place is
    // its expert's rows placed by earlier rounds plus the same-expert pairs on lower lanes of this one.
    if (c.warp == 0) {
      for (int p0 = 0; p0 < B * K; p0 += 32) {
        const int p = p0 + c.lane, e = p < B * K ? sh.chosen[p] : -1;
        const unsigned same = __match_any_sync(0xffffffffu, e);
        const int before = __popc(same & ((1u << c.lane) - 1));
        if (e >= 0) c.st.slot_rows(sh.slot[e])[sh.fill[e] + before] = p;
        __syncwarp();
        if (e >= 0 && before == 0) sh.fill[e] += __popc(same);
        __syncwarp();
      }
    }
    return true;
  }
};

}  // namespace vllm_megakernel

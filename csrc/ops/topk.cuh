// The top-k and the expert work list, shared by ROUTER_TOPK (ops/router.cuh, on its consumer warps) and, with
// the step's local_routing, by every expert task's producer warp (LocalRoute, called from ops/moe.cuh), so that
// both choose the same experts into the same slots: per batch row the k best scores (lowest expert id on
// ties), each chosen expert a slot in ascending expert order with its (token * K + k) rows ascending. With the
// step's uniform_routing set, a row's experts are the first K distinct values of the draws j = 0, 1, ... (a
// hash of layer, the row's position, the row and j, modulo the expert count), with weight 1
// (reference.uniform_experts, which says how this relates to vLLM's uniform_random routing simulation).
#pragma once

#include <math_constants.h>

#include "../common.cuh"
#include "../roles.cuh"

namespace vllm_megakernel {

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

// The top-k and the expert work list, written once for ROUTER_TOPK (its consumer warps) and for the expert
// tasks' producers under local routing (LocalRoute below), so that both choose the same experts into the
// same slots.
namespace topk {
constexpr int E = abi::kNumExperts, K = abi::kTopK, kPerLane = E / 32;
static_assert(E % 32 == 0, "experts are dealt to lanes");

// Lane k < K of a warp: the expert of rank k among a row's E scores (lowest id on ties) and its score;
// every lane: the sum of the K scores in rank order (the renormalisation's). Scores are sigmoids, in [0, 1]:
// their bit patterns order like the values, so a round's arg-max is one warp max-reduction of keys (the
// bits + 2; 1: a NaN score, chosen after every number; 0: taken) and one min-reduction of the expert ids
// that hold it. `loaded()` runs once the row's scores are in registers (the trace's mark).
struct Ranked {
  int expert;
  float score, total;
};
// A score's ranking key (see Ranked above): never 0, so a zeroed key is "not posted" (the step's posted_scores,
// where the routers store these and the top-k polls them).
__device__ __forceinline__ uint32_t score_key(float v) { return v >= 0.f ? __float_as_uint(v) + 2u : 1u; }

// The ranking of one row from its keys, lane + 32 j in key[j] (every lane; knocked out as it goes).
__device__ __forceinline__ Ranked rank_keys(uint32_t (&key)[kPerLane], int lane) {
  Ranked mine{-1, 0.f, 0.f};
#pragma unroll 1
  for (int k = 0; k < K; ++k) {
    uint32_t best = 0;
    int best_e = E;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (key[j] > best) best = key[j], best_e = lane + 32 * j;  // j ascending: ties keep the lower id
    const uint32_t top = __reduce_max_sync(0xffffffffu, best);
    const int e = __reduce_min_sync(0xffffffffu, (unsigned)(best == top ? best_e : E));
    // knocked out for the next round; indexed by a constant, so key[] stays in registers (key[e >> 5] put it
    // in local memory: a load and a store of it on every round, the chain's latency)
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (e == lane + 32 * j) key[j] = 0;
    const float score = top >= 2u ? __uint_as_float(top - 2u) : CUDART_NAN_F;
    if (lane == k) mine.expert = e, mine.score = score;
    mine.total += score;
  }
  return mine;
}

// The ranking of one row from its scores (row_scores[e]).
template <class Loaded>
__device__ __forceinline__ Ranked choose_row(const float* row_scores, int lane, Loaded loaded) {
  uint32_t key[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) key[j] = score_key(row_scores[lane + 32 * j]);
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) asm volatile("" ::"r"(key[j]));  // the loads land before loaded()
  loaded();
  return rank_keys(key, lane);
}

// A row's experts by uniform draws (reference.uniform_experts) into row[0..K), one warp: lane l holds draw
// j0 + l; a draw is taken if no earlier lane drew its value and no expert taken from an earlier round is
// it, in lane order, until the row has K (32 draws almost always do). Distinct like a real top-k: an
// expert's rows never outnumber the batch, which the route buffer's per-slot row lists and the GEMMs'
// register tiles rely on.
__device__ __forceinline__ void choose_uniform_row(int* row, int layer, long long position, int r, int lane) {
  for (int j0 = 0, found = 0; found < K; j0 += 32) {
    const int e = uniform_draw(layer, position, r, j0 + lane);
    bool fresh = (__match_any_sync(0xffffffffu, e) & ((1u << lane) - 1)) == 0;
    for (int q = 0; q < found; ++q) fresh &= row[q] != e;
    const unsigned taken = __ballot_sync(0xffffffffu, fresh);
    const int k = found + __popc(taken & ((1u << lane) - 1));
    if (fresh && k < K) row[k] = e;
    found += __popc(taken);
    __syncwarp();  // this round's choices are read by the next one, and by the caller
  }
}

// A slot's posted word (abi.ROUTE_POST), written and read here only: before its rows, the posted bit, the
// expert and the row count; row `at` of the slot is or-ed in by route_post_row.
constexpr unsigned long long kPosted = 1ull << abi::kPostPostedBit;
constexpr int kPostFirstPair = abi::kPostExpertBits + abi::kPostCountBits;  // bit of a slot's row 0
__device__ __forceinline__ unsigned long long route_post_head(int expert, int count) {
  return kPosted | (unsigned long long)expert | (unsigned long long)count << abi::kPostExpertBits;
}
__device__ __forceinline__ unsigned long long route_post_row(int at, int pair) {
  return (unsigned long long)pair << (kPostFirstPair + at * abi::kPostPairBits);
}
__device__ __forceinline__ int route_post_expert(unsigned long long word) {
  return (int)word & ((1 << abi::kPostExpertBits) - 1);
}
__device__ __forceinline__ int route_post_count(unsigned long long word) {
  return (int)(word >> abi::kPostExpertBits) & ((1 << abi::kPostCountBits) - 1);
}
__device__ __forceinline__ int route_post_pair(unsigned long long word, int at) {
  return (int)(word >> (kPostFirstPair + at * abi::kPostPairBits)) & ((1 << abi::kPostPairBits) - 1);
}

// Posted routing at batch 1, straight from choose_row on one warp (every lane; lane k < K holds the expert of
// rank k, `live` the same on every lane): one row's K experts are distinct, so its work list is K slots of one
// pair each in ascending expert order, the slot of lane k's expert the number of the row's experts below it and
// its pair k. These are the words build_work_list posts for the same row; stored here, before the work list's
// shared-memory passes and syncs, they reach the expert tasks' producers about 2 us sooner at batch 1 (the
// top-k's run was 3.4 us, its choice done at 1.4: session AO's profile). Relaxed stores, as there: each word
// carries its own posted bit. A padding row is not routed: the head word alone, with no slots.
__device__ __forceinline__ void post_one_row(unsigned long long* words, int expert, bool live, int lane) {
  using Word = cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>;
  int below = 0;
#pragma unroll
  for (int j = 0; j < K; ++j) below += __shfl_sync(0xffffffffu, expert, j) < expert;
  if (live && lane < K)
    Word(words[1 + below]).store(route_post_head(expert, 1) | route_post_row(0, lane), cuda::memory_order_relaxed);
  if (lane == 0) Word(words[0]).store(kPosted | (unsigned long long)(live ? K : 0), cuda::memory_order_relaxed);
}

// The layer's expert work list from its chosen pairs (chosen[p], p = row * K + k; -1: not routed): each
// chosen expert a slot in ascending expert order, with its pairs ascending in rows[slot * rows_stride ..].
// Run by `threads` threads, this one `tid` (warp 0: tid < 32); chosen[] complete and count[] / fill[]
// (shared, E each) zeroed before the call and visible to all of them; sync() orders their shared-memory
// accesses. Returns the slot count on warp 0's lanes. `post` (shared, one word a slot; posted routing, up to
// abi::kPostedRoutingMaxBatch rows): also each slot's posted word, complete on warp 0 after a __syncwarp().
template <class Sync>
__device__ __forceinline__ int build_work_list(const int* chosen, int pairs, int* count, int* slot_of, int* fill,
                                               int* slot_expert, int* slot_count, int* rows, int rows_stride, int tid,
                                               int threads, Sync sync, unsigned long long* post = nullptr) {
  for (int p = tid; p < pairs; p += threads)
    if (chosen[p] >= 0) atomicAdd(&count[chosen[p]], 1);
  sync();
  if (tid >= 32) return 0;
  const int lane = tid;
  int base = 0;  // slots in ascending expert order: an exclusive scan of "chosen at all"
  for (int e0 = 0; e0 < E; e0 += 32) {
    const int e = e0 + lane, n = count[e];
    const unsigned used = __ballot_sync(0xffffffffu, n > 0);
    const int slot = base + __popc(used & ((1u << lane) - 1));
    slot_of[e] = n > 0 ? slot : -1;
    if (n > 0) {
      slot_expert[slot] = e;
      slot_count[slot] = n;
      if (post) post[slot] = route_post_head(e, n);
    }
    base += __popc(used);
  }
  __syncwarp();  // slot_of[] is read across lanes below
  // Each expert's pairs, ascending, 32 at a time: a pair's place is its expert's pairs placed by earlier
  // rounds plus the same-expert pairs on lower lanes of this one.
  for (int p0 = 0; p0 < pairs; p0 += 32) {
    const int p = p0 + lane, e = p < pairs ? chosen[p] : -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int before = __popc(same & ((1u << lane) - 1));
    if (e >= 0) {
      rows[slot_of[e] * rows_stride + fill[e] + before] = p;
      if (post) {  // the row's bits, or-ed into each 32-bit half (a 64-bit shared atomicOr is a CAS loop)
        const unsigned long long bits = route_post_row(fill[e] + before, p);
        unsigned int* half = reinterpret_cast<unsigned int*>(&post[slot_of[e]]);  // little-endian: low first
        if ((unsigned int)bits) atomicOr(&half[0], (unsigned int)bits);
        if (bits >> 32) atomicOr(&half[1], (unsigned int)(bits >> 32));
      }
    }
    __syncwarp();
    if (e >= 0 && before == 0) fill[e] += __popc(same);
    __syncwarp();
  }
  return base;
}
}  // namespace topk

// Local routing (the step's local_routing, schedule.StepShape): an expert task's producer warp computes the
// layer's routing itself, as ROUTER_TOPK does (topk:: above), once per layer on its SM (RoutingSeen in
// moe.cuh), from the router's scores: the expert loads start a top-k task and a barrier hop earlier (3 us a
// layer at batch 1; the step still measured slower, layout.local_routing_for says why). Sized for
// abi::kLocalRoutingMaxBatch rows; the rows of slot s at rows[s * batch].
struct LocalRoute {
  static constexpr int kRows = abi::kLocalRoutingMaxBatch;
  static constexpr int kSlots = topk::E < kRows * topk::K ? topk::E : kRows * topk::K;
  static_assert(kRows <= abi::kRoutedPairWords, "a slot's rows fit the descriptor: no consumer reads the route buffer");
  alignas(16) float scores[kRows * topk::E];
  int chosen[kRows * topk::K];
  int count[topk::E], slot_of[topk::E], fill[topk::E];
  int slot_expert[kSlots], slot_count[kSlots];
  int rows[kSlots * kRows];
};

// Every lane of the producer warp, after lane 0 acquired the layer's router barrier and a __syncwarp(): the
// layer's work list into lr; returns the slot count on every lane. The scores come in with 16-byte cp.async
// copies, all in flight at once (a round trip, not one a row), past L1 (cg): another SM wrote them.
__device__ __forceinline__ int route_locally(const Step& st, int layer, LocalRoute& lr, int lane) {
  constexpr int E = topk::E, K = topk::K;
  const int B = st.batch();
  const bool uniform = st.i(abi::S_UNIFORM_ROUTING) != 0;
  if (!uniform) {
    const float* scores = st.scores(layer);
    for (int i = lane * 4; i < B * E; i += 32 * 4)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(lr.scores + i)),
                   "l"(scores + i)
                   : "memory");
    asm volatile("cp.async.wait_all;" ::: "memory");
  }
  for (int e = lane; e < E; e += 32) lr.count[e] = lr.fill[e] = 0;
  __syncwarp();  // every lane's copies landed before any lane reads a row
  for (int r = 0; r < B; ++r) {
    const bool live = st.seq_len(r) > 0;  // padding rows are not routed
    int* row = lr.chosen + r * K;
    if (uniform) {
      topk::choose_uniform_row(row, layer, st.ptr<const long long>(abi::S_POSITIONS)[r], r, lane);
      if (lane < K && !live) row[lane] = -1;
    } else {
      const topk::Ranked x = topk::choose_row(lr.scores + r * E, lane, [] {});
      if (lane < K) row[lane] = live ? x.expert : -1;
    }
  }
  __syncwarp();
  const int active = topk::build_work_list(lr.chosen, B * K, lr.count, lr.slot_of, lr.fill, lr.slot_expert,
                                           lr.slot_count, lr.rows, B, lane, 32, [] { __syncwarp(); });
  __syncwarp();  // the work list is read by lane 0 (moe.cuh)
  return __shfl_sync(0xffffffffu, active, 0);
}

}  // namespace vllm_megakernel

// MOE_UPGATE, MOE_DOWN, MOE_COMBINE: the routed experts over ROUTER_TOPK's work list.
//
// Rows are (token * K + k) pairs, so every (token, expert) pair owns one row of act and expert_out and no
// two tasks write the same row. Which expert a slot holds is this step's data: before the consumers see an
// expert task's descriptor, the producer waits on the layer's routing (the descriptor's load_wait) and
// writes the slot's expert, row count and rows into the descriptor (complete_routed_descriptor, abi's
// routed descriptors); both sides then read only those words, so they agree on whether the slot has work
// at all. An expert task whose slot is past the layer's num_active is skipped by its producer (never
// published); the top-k's signaller makes up the down barrier's count for those (abi.py). With the step's
// posted_routing the producer waits on the layer's router wave instead and then polls the slot's posted
// word, which holds all of that (poll_route_post).
//
// The up/gate task's activation rows (hn of the slot's tokens) come through the stage ring as the task's
// first stage when they fit one (at most kStagedRows rows): the producer copies them once the routing is
// in, so the consumers start on shared memory instead of a round trip to L2. The down task's rows (act,
// written by the slot's up/gate tasks, which only the consumers wait for) are gathered by the consumers.
//
// Claimed expert tasks (abi.py, the `claim` field): the producer takes the task's number n in its wave
// from the wave's counter and rewrites the descriptor into the wave's n-th task before the consumers see
// it (claimed_word below); consumers and the loop then run it like any other.
#pragma once

#include "gemm.cuh"
#include "topk.cuh"

namespace vllm_megakernel {

// Both routed opcodes lay out (slot, first column / row, width, claim) at the routed words (abi.ROUTED_LEAD).
static_assert(abi::F_MOE_UPGATE_SLOT == abi::F_ROUTED_SLOT && abi::F_MOE_DOWN_SLOT == abi::F_ROUTED_SLOT &&
              abi::F_MOE_UPGATE_COL0 == abi::F_ROUTED_FIRST && abi::F_MOE_DOWN_ROW0 == abi::F_ROUTED_FIRST &&
              abi::F_MOE_UPGATE_COLS == abi::F_ROUTED_WIDTH && abi::F_MOE_DOWN_ROWS == abi::F_ROUTED_WIDTH &&
              abi::F_MOE_UPGATE_CLAIM == abi::F_ROUTED_CLAIM && abi::F_MOE_DOWN_CLAIM == abi::F_ROUTED_CLAIM,
              "routed opcodes share their leading words");

// This lane's word of the wave's n-th task, from this lane's word of the claiming task (the whole producer
// warp calls it). The host numbers a wave slot-major (n = slot * tiles + tile) with its per-slot barriers
// in consecutive words, and schedule._check_claim_waves holds it to that; so the claiming task's own
// (slot, tile, barrier, index) give the rest.
__device__ __forceinline__ int claimed_word(int op, int word, int n) {
  const bool up = op == abi::OP_MOE_UPGATE;
  const int f_slot_barrier = up ? abi::F_SIGNAL_BARRIER : abi::F_WAIT0_BARRIER;
  const int slot0 = __shfl_sync(0xffffffffu, word, abi::F_ROUTED_SLOT);
  const int first0 = __shfl_sync(0xffffffffu, word, abi::F_ROUTED_FIRST);
  const int width = __shfl_sync(0xffffffffu, word, abi::F_ROUTED_WIDTH);
  const int barrier0 = __shfl_sync(0xffffffffu, word, f_slot_barrier);
  const int index0 = __shfl_sync(0xffffffffu, word, abi::F_TASK_INDEX);
  const int total = up ? abi::kMoeIntermediate : abi::kHidden;
  const int tiles = (total + width - 1) / width;  // a slot's last down tile may be narrower (MoeDownOp::task_rows)
  const int slot = n / tiles, tile = n % tiles;
  const int lane = Role::lane();
  if (lane == abi::F_ROUTED_SLOT) return slot;
  if (lane == abi::F_ROUTED_FIRST) return tile * width;
  if (lane == f_slot_barrier) return barrier0 == abi::kNoBarrier ? barrier0 : barrier0 - slot0 + slot;
  if (lane == abi::F_TASK_INDEX) return index0 - (slot0 * tiles + first0 / width) + n;
  if (lane == abi::F_ROUTED_CLAIM) return abi::kNoBarrier;  // claimed
  return word;
}

// What the producer does with a routed task once its descriptor is completed.
enum class Routed { kAbort, kDead, kLive };

// What a producer has learned of the routing, kept across its places (every lane holds the same values).
// A dead place costs the producer its time and delays the loads of every place behind it on the SM (at
// batch 16 a fifth of the layer went to expert places of dead slots), so a dead place should cost as
// little as possible:
//   - the routing of `layer` was waited for (acquired by lane 0, whose later reads of it are ordered after
//     that acquire) and `active` read: the SM's later routed places of the layer skip the wait and decide a
//     dead slot from `active` alone, without reading its route words;
//   - `exhausted`: a claim counter that handed this producer a dead slot's tile. A wave numbers its tiles
//     slot by slot, the routed (live) slots first, and its counter hands out numbers in increasing order,
//     so every later number on it is dead too: the SM's later places of that wave are skipped without a
//     claim. Their tiles stay unclaimed; nothing waits on a dead slot's tiles (abi.py's routed
//     descriptors).
struct RoutingSeen {
  int layer = -1;
  int active = 0;
  int exhausted = abi::kNoBarrier;
};

// A place of a wave whose claims handed this producer a dead tile: skipped before it takes a ring position
// (every lane calls it with its word of the place's descriptor).
__device__ __forceinline__ bool on_exhausted_wave(int op, int claim, const RoutingSeen& seen) {
  return abi::routed_descriptor(op) && claim != abi::kNoBarrier && claim == seen.exhausted;
}
__device__ __forceinline__ bool skipped_unclaimed(int op, int word, const RoutingSeen& seen) {
  return on_exhausted_wave(op, __shfl_sync(0xffffffffu, word, abi::F_ROUTED_CLAIM), seen);
}

// The first place at or after `from` in the SM's list that skipped_unclaimed would not skip (max_tasks if
// none): an exhausted wave's places follow one another, and reading them one by one would cost a
// dependent round trip each, so the warp reads 16 places' opcode and claim words per round trip.
__device__ __forceinline__ int first_unskipped(const int* my_tasks, int from, int max_tasks,
                                               const RoutingSeen& seen) {
  const int lane = Role::lane();
  for (int f = from; f < max_tasks; f += 16) {
    const int place = f + (lane >> 1);  // lanes 2j and 2j+1: place f + j's opcode and claim words
    int w = abi::OP_END;                // past the list: not skipped, so the scan stops there
    if (place < max_tasks) w = my_tasks[(long long)place * abi::kTaskWords + ((lane & 1) ? abi::F_ROUTED_CLAIM : 0)];
    const int claim = __shfl_down_sync(0xffffffffu, w, 1);
    const bool even = (lane & 1) == 0;
    const unsigned stop = __ballot_sync(0xffffffffu, even && !on_exhausted_wave(w, claim, seen));
    if (stop) return min(max_tasks, f + (__ffs(stop) - 1) / 2);
  }
  return max_tasks;
}

// Posted routing (the step's posted_routing): lane 0 of the producer warp polls its layer's posted words
// (abi.ROUTE_POST, stored by the top-k, ops/router.cuh) until it knows the layer's routed slot count, `active`
// (given: >= 0, when the layer is known), and, for a live slot, the slot's word. A poll's two loads go out
// together: one round trip. They are relaxed: each word carries its own posted bit, and nothing else the top-k
// wrote is read on the strength of it (the up/gate task's staged hn rows are ordered by the router wave's
// barrier, the load wait before this). Bounded (poll_bounded, as wait_barrier); false on an abort or a timeout (recorded with
// abi::kPostedRouteWait, the slot, and the slot count seen, -1 while the layer's head word was not posted).
__device__ __forceinline__ bool poll_route_post(Producer& p, int layer, int slot, int& active,
                                                unsigned long long& word, const int* desc) {
  using Word = cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>;
  unsigned long long* posts = p.st.route_posts(layer);
  unsigned long long head = active >= 0 ? topk::kPosted | (unsigned long long)active : 0ull;
  const bool ok = poll_bounded(
      [&] {
        if (!(head & topk::kPosted)) head = Word(posts[0]).load(cuda::memory_order_relaxed);
        word = Word(posts[1 + slot]).load(cuda::memory_order_relaxed);
        if (!(head & topk::kPosted)) return false;
        active = (int)(head & ~topk::kPosted);
        return slot >= active || (word & topk::kPosted) != 0;  // a dead slot's word is never posted
      },
      [&] { report_stall(p.error, desc, abi::kPostedRouteWait, slot, head & topk::kPosted ? active : -1); },
      p.error, p.timeout_ns);
  if (!ok) p.stages.p.abort = 1;
  return ok;
}

// A slot's (expert, count, rows) from its posted word into the descriptor's routed words.
__device__ __forceinline__ void routed_words_from_post(int* desc, unsigned long long word) {
  const int count = topk::route_post_count(word);
  desc[abi::F_ROUTED_EXPERT] = topk::route_post_expert(word);
  desc[abi::F_ROUTED_COUNT] = count;
#pragma unroll
  for (int j = 0; j < abi::kRoutedPairWords; ++j) desc[abi::F_ROUTED_PAIR0 + j] = j < count ? topk::route_post_pair(word, j) : 0;
}

// The consumers' input wait on the routing, when it is the barrier this producer thread acquired as the task's
// load wait: already satisfied (the consumers see the descriptor after this), so dropped, sparing the consumer
// leader a round trip to L2.
__device__ __forceinline__ void drop_acquired_routing_wait(int* desc) {
  if (desc[abi::F_WAIT0_BARRIER] == desc[abi::F_LOAD_WAIT_BARRIER] &&
      desc[abi::F_WAIT0_COUNT] <= desc[abi::F_LOAD_WAIT_COUNT])
    desc[abi::F_WAIT0_BARRIER] = abi::kNoBarrier;
}

// The producer warp's completion of a routed (expert) task's descriptor, in place in the descriptor ring;
// every lane calls it with its word of the descriptor and gets its final word back. A claiming task takes
// its number first: the number does not depend on the routing, so its round trip overlaps the wait. Then
// lane 0 waits for the layer's routing (the first of the layer's places on this SM only) and reads the
// slot's route words in one round trip (every load issued before the first is used). A wait of the
// consumers' on the routing is then dropped from the descriptor. With posted routing the wait is the router
// wave's and the slot's words come from its posted word, polled (poll_route_post). kDead: the slot is past the
// routed count, and the producer skips the task (abi.py's routed descriptors); kAbort: the step is being aborted.
__device__ __forceinline__ Routed complete_routed_descriptor(Producer& p, LocalRoute& lr, int* desc, const Layer& ly,
                                                             int op, int& word, RoutingSeen& seen) {
  const int lane = Role::lane();
  const int counter = __shfl_sync(0xffffffffu, word, abi::F_ROUTED_CLAIM);  // kNoBarrier: not claiming
  const int layer = __shfl_sync(0xffffffffu, word, abi::F_LAYER);
  const bool known = layer == seen.layer;  // this layer's routing already acquired (posted: its count polled),
                                           // its count in `active`
  desc[lane] = word;
  __syncwarp();
  int n = 0;
  if (lane == 0) {
    if (counter != abi::kNoBarrier) n = atomicAdd(&p.barriers[counter], 1);
    if (!known && !p.load_wait(Task{desc, ly})) n = -1;
  }
  n = __shfl_sync(0xffffffffu, n, 0);
  if (n < 0) return Routed::kAbort;
  // Local routing: the load_wait above was the router wave's; the warp chooses the layer's experts itself.
  const bool local = p.st.i(abi::S_LOCAL_ROUTING) != 0;
  int local_active = 0;
  if (local && !known) {
    __syncwarp();  // orders lane 0's acquire of the router barrier before the other lanes' reads of the scores
    local_active = route_locally(p.st, layer, lr, lane);
  }
  if (counter != abi::kNoBarrier) word = claimed_word(op, word, n);
  __syncwarp();  // lane 0's reads of the words above (load_wait) before the other lanes rewrite theirs: the
                 // shuffle that waited for lane 0 orders no memory (racecheck's warp-level WAR warnings)
  desc[lane] = word;
  __syncwarp();
  int live = 0, active = seen.active;
  const bool posted = p.st.i(abi::S_POSTED_ROUTING) != 0;
  if (lane == 0 && posted) {
    const int slot = desc[abi::F_ROUTED_SLOT];
    if (!known || slot < active) {  // a known layer's dead slot needs no poll
      unsigned long long post = 0;
      if (!known) active = -1;
      if (!poll_route_post(p, layer, slot, active, post, desc)) {
        live = -1;
      } else if (slot < active) {
        drop_acquired_routing_wait(desc);  // the router wave's here
        routed_words_from_post(desc, post);
      }
    }
    if (live == 0) live = slot < active;
  } else if (lane == 0) {
    const int slot = desc[abi::F_ROUTED_SLOT], B = p.st.batch();
    if (!known || slot < active) {  // a known layer's dead slot needs none of the reads below
      // This layer's own count: a producer can reach a dead slot's place after the layer finished without
      // it and the next layer's top-k rewrote the rest of the route buffer; a live slot's words cannot
      // change before its tasks ran (the layer waits on them).
      if (!known) active = local ? local_active : p.st.layer_active()[layer];
      const int expert = local ? lr.slot_expert[slot] : p.st.slot_expert()[slot];
      const int count = local ? lr.slot_count[slot] : p.st.slot_count()[slot];
      const int* rows = local ? lr.rows + slot * B : p.st.slot_rows(slot);
      int pair[abi::kRoutedPairWords];
#pragma unroll
      for (int j = 0; j < abi::kRoutedPairWords; ++j) pair[j] = j < B ? rows[j] : 0;
      drop_acquired_routing_wait(desc);
      desc[abi::F_ROUTED_EXPERT] = expert;
      desc[abi::F_ROUTED_COUNT] = count;
#pragma unroll
      for (int j = 0; j < abi::kRoutedPairWords; ++j) desc[abi::F_ROUTED_PAIR0 + j] = pair[j];
    }
    live = slot < active;
  }
  __syncwarp();  // lane 0's words are read by the other lanes below, or rewritten by them at the next place
  live = __shfl_sync(0xffffffffu, live, 0);
  if (live < 0) return Routed::kAbort;
  seen.layer = layer;
  seen.active = __shfl_sync(0xffffffffu, active, 0);
  if (!live) {
    if (counter != abi::kNoBarrier) seen.exhausted = counter;
    return Routed::kDead;
  }
  word = desc[lane];
  return Routed::kLive;
}

// A routed task's (token * K + k) rows: from its descriptor when they fit there, else the route buffer.
__device__ __forceinline__ const int* routed_rows(const Step& st, const Task& t, int count) {
  return count <= abi::kRoutedPairWords ? t.d + abi::F_ROUTED_PAIR0 : st.slot_rows(t[abi::F_ROUTED_SLOT]);
}

// Up/gate activation rows staged by the producer: at most one stage of hidden-wide rows.
constexpr int kStagedRows = kStageBytes / (abi::kHidden * 2);
static_assert(kStagedRows >= 1, "a stage holds at least one hidden-wide row");
static_assert(kStagedRows <= 8, "staged rows fill at most the first 8-row half of the mma tile (ActTile<K, 1>)");

// Rows of a staged activation tile: row b at stage + b * K (nullptr past `count`: a zero row).
template <int K>
struct StagedRows {
  const bf16* stage;
  int count;
  __device__ const bf16* row(int b) const { return b < count ? stage + (long long)b * K : nullptr; }
};

struct MoeUpgateOp {
  static constexpr int K = abi::kHidden, RS = abi::kMoeUpStageRows, I = abi::kMoeIntermediate;
  struct Shared {
    float part[abi::kPartialFloats];
  };

  static __device__ bool load(Producer& p, const Task& t) {
    const int expert = t[abi::F_ROUTED_EXPERT], count = t[abi::F_ROUTED_COUNT];
    if (count <= kStagedRows) {  // the activation rows first: the consumers read them before any weight
      const bf16* hn = p.st.ptr<const bf16>(abi::S_HN);
      const int* rows = t.d + abi::F_ROUTED_PAIR0;
      uint8_t* dst = p.stages.begin(count * K * 2);
      if (!dst) return false;
      for (int b = 0; b < count; ++b) p.stages.copy(dst + b * K * 2, hn + (long long)(rows[b] / abi::kTopK) * K, K * 2);
      p.stages.end();
    }
    const int col0 = t[abi::F_MOE_UPGATE_COL0], cols = t[abi::F_MOE_UPGATE_COLS];
    const bf16* w = t.ly.ptr<const bf16>(abi::L_W13) + (long long)expert * 2 * I * K;
    return load_weight_rows<K, RS>(p, w + (long long)col0 * K, cols) &&
           load_weight_rows<K, RS>(p, w + (long long)(I + col0) * K, cols);
  }

  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    const int count = t[abi::F_ROUTED_COUNT];
    const int col0 = t[abi::F_MOE_UPGATE_COL0], cols = t[abi::F_MOE_UPGATE_COLS], R = 2 * cols;
    const int bp = padded_rows(count);
    const int* rows = routed_rows(c.st, t, count);
    bool ok;
    if (count <= kStagedRows) {
      const uint8_t* stage = c.stages.wait();
      if (!stage) return false;
      ActTile<K, 1> a;
      a.load(StagedRows<K>{reinterpret_cast<const bf16*>(stage), count}, 0, c.warp, c.lane);
      c.stages.release();
      ok = gemm_stages<K, RS, 1>(c, a, R / RS, sh.part, R, bp);
    } else {
      const GatheredRows src{c.st.ptr<const bf16>(abi::S_HN), K, count, rows, abi::kTopK};
      ok = gemm_task<K, RS>(c, src, count, R, sh.part);
    }
    if (!ok) return false;
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

  // The task's rows: `rows` is its wave's tile width, the same on every task of the wave (claims rewrite
  // only the first row), so a slot's last tile, where hidden is not a multiple of it, is cut at hidden.
  static __device__ int task_rows(const Task& t) { return min(t[abi::F_MOE_DOWN_ROWS], abi::kHidden - t[abi::F_MOE_DOWN_ROW0]); }

  static __device__ bool load(Producer& p, const Task& t) {
    const int expert = t[abi::F_ROUTED_EXPERT];
    const bf16* w = t.ly.ptr<const bf16>(abi::L_W2) + ((long long)expert * abi::kHidden + t[abi::F_MOE_DOWN_ROW0]) * K;
    return load_weight_rows<K, RS>(p, w, task_rows(t));
  }

  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    const int row0 = t[abi::F_MOE_DOWN_ROW0], R = task_rows(t);
    const int count = t[abi::F_ROUTED_COUNT], bp = padded_rows(count);
    const int* rows = routed_rows(c.st, t, count);
    const GatheredRows src{c.st.ptr<const bf16>(abi::S_ACT), K, count, rows, 1};
    if (!gemm_task<K, RS>(c, src, count, R, sh.part)) return false;
    bf16* eout = c.st.ptr<bf16>(abi::S_EOUT) + row0;
    store_rows<RS>(c, sh.part, R, count, bp, [&](int b) { return eout + (long long)rows[b] * abi::kHidden; });
    return true;
  }
};

// One 16-byte vector of the MoE combine: bf16(sum_k w[k] * e[k]) over a row's top-k expert outputs, in fp32
// with k in order, rounded once. MOE_COMBINE and a NORM with the combine folded into it (norm.cuh) both sum
// through here, so the two forms give the same bits.
__device__ __forceinline__ uint4 combine_experts8(const float (&w)[abi::kTopK], const uint4 (&e)[abi::kTopK]) {
  float acc[8] = {};
#pragma unroll
  for (int k = 0; k < abi::kTopK; ++k) {
    float f[8];
    unpack8(e[k], f);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += w[k] * f[i];
  }
  return pack8(acc);
}

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
      uint4 out = make_uint4(0, 0, 0, 0);
      if (c.st.seq_len(b) > 0) {  // padding rows were not routed
        float w[abi::kTopK];
        uint4 e[abi::kTopK];
#pragma unroll
        for (int k = 0; k < abi::kTopK; ++k) {
          w[k] = topk_w[b * abi::kTopK + k];
          e[k] = load16(eout + (long long)(b * abi::kTopK + k) * abi::kHidden + col);
        }
        out = combine_experts8(w, e);
      }
      store16(mlp + (long long)b * abi::kHidden + col, out);
    }
    return true;
  }
};

}  // namespace vllm_megakernel

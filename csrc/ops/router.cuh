// ROUTER and ROUTER_TOPK: the MoE layer's expert choice, spread over many SMs and then gathered.
//
// ROUTER: expert rows [row0, row0 + rows) of the router GEMM; logits are rounded to bf16 (vLLM's gate is a
// bf16 linear) and scored with sigmoid in fp32 into the scores buffer. In the folded form its first task
// also stores hn for the layer's expert up/gate tasks.
// ROUTER_TOPK: the k best scores of each batch row, their weights (renormalised only when the config says
// so; North Mini Code: no), and the layer's expert work list in the route buffer (ops/topk.cuh says how
// both are chosen); slots past num_active stay empty and the producers skip those slots' expert tasks.
// Padding rows (seq_len 0) are not routed. With the step's local_routing the expert tasks' producers build
// the same work list themselves from the scores (topk.cuh's LocalRoute) and nothing waits on this one but
// the MoE combine, for the weights. With its posted_routing this one also stores the work list as posted
// words (abi.ROUTE_POST: the layer's slot count, then one word a slot holding its expert and rows, each with
// its own posted bit) as soon as it is built (at batch 1 as soon as the row's experts are chosen,
// topk::post_one_row): the expert tasks' producers poll them (ops/moe.cuh), so the
// routing reaches them without this task's fence and barrier and without a second read; again only the MoE
// combine waits on its barrier. With the step's posted_scores every ROUTER task also stores its scores as the
// top-k's ranking keys (topk::score_key, never 0) in the step's barrier array, and the top-k, which the loop
// then does not hold for the router wave's barrier, polls its rows' keys: the routing loses the routers' fences
// and signals, the barrier's round trip and the second read of the scores.
#pragma once

#include "norm.cuh"
#include "topk.cuh"

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
    float* scores = c.st.scores(t.layer());
    uint32_t* keys = c.st.posted_scores() ? c.st.score_posts(t.layer()) : nullptr;
    for (int idx = c.thread; idx < R * B; idx += kConsumerThreads) {
      const int r = idx % R, b = idx / R;
      const float logit = round_bf16(sh.part[r * bp + b]);
      const float score = 1.f / (1.f + expf(-logit));
      const int at = b * abi::kNumExperts + row0 + r;
      scores[at] = score;
      // posted scores: the top-k polls this key (relaxed: each key is its own flag; RouterTopkOp::poll_keys)
      if (keys)
        cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(keys[at]).store(topk::score_key(score),
                                                                              cuda::memory_order_relaxed);
    }
    return true;
  }
};

struct RouterTopkOp {
  static constexpr int E = topk::E, K = topk::K;
  struct Shared {
    int chosen[abi::kMaxBatch * abi::kTopK];  // expert of pair (row, k); -1 for padding rows
    int count[abi::kNumExperts];
    int slot[abi::kNumExperts];
    int fill[abi::kNumExperts];  // rows placed so far per expert (the row placement's running offset)
    unsigned long long post[abi::kPostedRoutingMaxBatch * abi::kTopK];  // posted routing: each slot's word
  };

  static __device__ bool load(Producer&, const Task&) { return true; }

  // Whether the loop leaves this task's wait on the router wave to its body (megakernel.cu's reads_inputs): under
  // the step's posted_scores its warps poll their rows' keys instead, except under uniform routing, where it reads
  // no scores and waits as before (which also orders its rewrite of the route buffer and topk_w after the previous
  // layer's readers: the routers' barrier comes after them; with the poll, the keys it saw come after it too).
  static __device__ bool polls_inputs(const Step& st) {
    return st.posted_scores() && st.i(abi::S_UNIFORM_ROUTING) == 0;
  }

  // Posted scores: the warp polls batch row r's keys (lane + 32 j into key[j], zeroed by the caller) until every
  // one is posted, with relaxed loads: each key is its own flag, and nothing else a router wrote is read on the
  // strength of it. Bounded like every wait (barrier.cuh's poll_bounded, lane 0 deciding for the warp); false on
  // an abort or a timeout, recorded with abi::kPostedScoreWait, the row and how many of its keys were posted.
  static __device__ bool poll_keys(const Consumer& c, const Task& t, int r, uint32_t (&key)[topk::kPerLane]) {
    uint32_t* row = c.st.score_posts(t.layer()) + r * E;
    int* error = c.ctx().error;
    return poll_bounded(
        [&] {
          bool all = true;
#pragma unroll
          for (int j = 0; j < topk::kPerLane; ++j) {
            if (!key[j])
              key[j] = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(row[c.lane + 32 * j])
                           .load(cuda::memory_order_relaxed);
            all &= key[j] != 0;
          }
          return __all_sync(0xffffffffu, all);
        },
        [&] {
          int posted = 0;
#pragma unroll
          for (int j = 0; j < topk::kPerLane; ++j) posted += key[j] != 0;
          posted = __reduce_add_sync(0xffffffffu, posted);
          if (c.lane == 0) report_stall(error, t.d, abi::kPostedScoreWait, r, posted);
        },
        error, c.st.i(abi::S_TIMEOUT_NS), WholeWarp{});
  }

  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    const int B = c.st.batch(), layer = t.layer();
    const float* scores = c.st.scores(layer);
    float* topk_w = c.st.ptr<float>(abi::S_TOPK_W);
    int* route_log = c.st.ptr<int>(abi::S_ROUTE_LOG);
    const bool renorm = c.st.i(abi::S_NORM_TOPK_PROB) != 0;
    for (int e = c.thread; e < E; e += kConsumerThreads) sh.count[e] = sh.fill[e] = 0;
    const bool uniform = c.st.i(abi::S_UNIFORM_ROUTING) != 0;
    const bool posted = c.st.i(abi::S_POSTED_ROUTING) != 0;  // the host allows it up to kPostedRoutingMaxBatch rows
    const bool post_now = posted && B == 1 && !uniform;      // topk::post_one_row, as soon as the row is chosen
    if (uniform) c.mark_inputs();  // no scores to read
    for (int r = c.warp; r < B && uniform; r += kConsumerWarps) {
      int* row = sh.chosen + r * K;
      topk::choose_uniform_row(row, layer, c.st.ptr<const long long>(abi::S_POSITIONS)[r], r, c.lane);
      if (c.lane < K) {
        if (route_log) route_log[((long long)layer * B + r) * K + c.lane] = row[c.lane];
        if (c.st.seq_len(r) == 0) row[c.lane] = -1;  // padding rows are not routed
        topk_w[r * K + c.lane] = 1.f;
      }
    }
    const bool poll = polls_inputs(c.st);
    for (int r = c.warp; r < B && !uniform; r += kConsumerWarps) {
      const bool live = c.st.seq_len(r) > 0;  // padding rows are not routed (their weights are unused)
      // the trace's first mark: the leader's first row's scores are in registers
      topk::Ranked x;
      if (poll) {
        uint32_t key[topk::kPerLane] = {};
        if (!poll_keys(c, t, r, key)) {
          c.abort();  // every consumer returns after the consumer_sync below
          break;
        }
        if (r == c.warp) c.mark_inputs();
        x = topk::rank_keys(key, c.lane);
      } else {
        x = topk::choose_row(scores + r * E, c.lane, [&] {
          if (r == c.warp) c.mark_inputs();
        });
      }
      if (c.lane < K) {
        sh.chosen[r * K + c.lane] = live ? x.expert : -1;
        if (route_log) route_log[((long long)layer * B + r) * K + c.lane] = x.expert;
        topk_w[r * K + c.lane] = renorm ? x.score / x.total : x.score;
      }
      if (post_now) topk::post_one_row(c.st.route_posts(layer), x.expert, live, c.lane);
    }
    c.mark_stages();  // the trace's second mark: every row's experts chosen (the work list below is the rest)
    consumer_sync();
    if (c.ctx().consumer_abort) return false;  // a poll of the posted scores above gave up
    const bool post_list = posted && !post_now;
    const int active = topk::build_work_list(sh.chosen, B * K, sh.count, sh.slot, sh.fill, c.st.slot_expert(),
                                             c.st.slot_count(), c.st.slot_rows(0), B, c.thread, kConsumerThreads,
                                             [] { consumer_sync(); }, post_list ? sh.post : nullptr);
    if (c.thread == 0) {
      c.st.route()[0] = active;
      c.st.layer_active()[layer] = active;  // the producers' and the signaller's count of this layer's slots
    }
    if (post_list && c.warp == 0) {  // warp 0 built the words (and holds `active`)
      __syncwarp();  // every lane's rows are in sh.post
      // Relaxed 64-bit stores, no fence: each word is single-copy atomic and carries its own posted bit, which
      // is all a polling producer needs; the route buffer and topk_w above are ordered for the MoE combine by
      // this task's fence and barrier, as always.
      unsigned long long* words = c.st.route_posts(layer);
      for (int s = c.lane; s < active; s += 32)
        cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>(words[1 + s])
            .store(sh.post[s], cuda::memory_order_relaxed);
      if (c.lane == 0)
        cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>(words[0])
            .store(topk::kPosted | (unsigned long long)active, cuda::memory_order_relaxed);
    }
    return true;
  }
};

}  // namespace vllm_megakernel

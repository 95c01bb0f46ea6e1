// ROUTER: router logits, sigmoid, top-k and the layer's expert work list, in one task (B*K <= 512 pairs).
//
// Logits are rounded to bf16 (vLLM's gate is a bf16 linear) and scored with sigmoid in fp32; the top-k
// weights are renormalised only when the config says so (North Mini Code: no). The work list gives each
// chosen expert a slot, in ascending expert order, with its (token * K + k) rows in ascending order; slots
// past num_active stay empty, and the expert tasks of those slots return at once. Padding rows
// (seq_len 0) are not routed.
#pragma once

#include <math_constants.h>

#include "../common.cuh"
#include "gemm_tile.cuh"

namespace vllm_megakernel {

__device__ void op_router(const Step& st, const Layer& ly, int layer, float* smem) {
  const int B = st.batch(), H = st.hidden(), E = (int)st.i(abi::S_NUM_EXPERTS), K = st.top_k();
  float* scores = smem;                                       // [B][E]
  int* chosen = reinterpret_cast<int*>(smem + B * E);          // [B][K]
  int* counts = chosen + B * K;                                // [E]
  gemm_tile(st.ptr<const bf16>(abi::S_HN), H, IdentityRow{}, B, ly.ptr<const bf16>(abi::L_ROUTER_W), H, 0, E, H,
            [&](int r, int n, float v) { scores[r * E + n] = 1.f / (1.f + expf(-round_bf16(v))); });
  worker_sync();
  const int warp = threadIdx.x / 32 - 1, lane = threadIdx.x % 32;
  float* topk_w = st.ptr<float>(abi::S_TOPK_W);
  int* route_log = st.ptr<int>(abi::S_ROUTE_LOG);
  const bool renorm = st.i(abi::S_NORM_TOPK_PROB) != 0;
  for (int r = warp; r < B; r += kWorkerWarps) {
    float total = 0.f;
    for (int k = 0; k < K; ++k) {  // k-th largest: warp arg-max, lowest expert id on ties
      float best = -CUDART_INF_F;
      int best_e = E;
      for (int e = lane; e < E; e += 32) {
        const float s = scores[r * E + e];
        if (s > best) best = s, best_e = e;
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
        if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
      }
      __syncwarp();  // every lane has read this round's scores before lane 0 knocks out the winner
      if (lane == 0) {
        chosen[r * K + k] = best_e;
        topk_w[r * K + k] = best;
        if (route_log) route_log[((long long)layer * B + r) * K + k] = best_e;
        scores[r * E + best_e] = -CUDART_INF_F;
      }
      total += best;
      __syncwarp();
    }
    if (renorm && lane == 0)
      for (int k = 0; k < K; ++k) topk_w[r * K + k] /= total;
  }
  worker_sync();
  if (threadIdx.x == 32) {  // the work list: a counting sort of (token, k) pairs by expert
    for (int e = 0; e < E; ++e) counts[e] = 0;
    for (int r = 0; r < B; ++r)
      if (st.seq_len(r) > 0)
        for (int k = 0; k < K; ++k) counts[chosen[r * K + k]]++;
    int* slot_expert = st.slot_expert();
    int* slot_count = st.slot_count();
    int active = 0;
    for (int e = 0; e < E; ++e) {
      if (counts[e] == 0) continue;
      slot_expert[active] = e;
      slot_count[active] = 0;
      counts[e] = active++;  // from here on: the expert's slot
    }
    for (int r = 0; r < B; ++r)
      if (st.seq_len(r) > 0)
        for (int k = 0; k < K; ++k) {
          const int slot = counts[chosen[r * K + k]];
          st.slot_rows(slot)[slot_count[slot]++] = r * K + k;
        }
    st.route()[0] = active;
  }
}

}  // namespace vllm_megakernel

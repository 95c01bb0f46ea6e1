// ATTN_PARTIAL and ATTN_COMBINE: split-KV paged decode attention over vLLM's cache and block tables.
//
// A (request, kv head, split) task attends the group's query heads (one worker warp per head) over its
// slice of the request's visible keys: positions [seq_len - W, seq_len) on sliding layers (W = window),
// [0, seq_len) on full layers, cut into num_splits equal chunks. The slice bounds come from the live
// seq_len on the device, so the task count is static while the work follows the batch. A slice that is
// empty (short sequence, padding row) writes lse = -inf, which the combine weighs as zero.
#pragma once

#include <math_constants.h>

#include "../common.cuh"

namespace vllm_megakernel {

constexpr int kMaxHeadDimPerLane = 8;  // head_dim <= 256

__device__ void op_attn_partial(const Step& st, const Layer& ly, const int* desc) {
  const int r = desc[abi::F_ATTN_PARTIAL_REQUEST], g = desc[abi::F_ATTN_PARTIAL_KV_HEAD];
  const int split = desc[abi::F_ATTN_PARTIAL_SPLIT], S = desc[abi::F_ATTN_PARTIAL_NUM_SPLITS];
  const int D = st.head_dim(), Hq = st.heads(), Hkv = st.kv_heads(), G = Hq / Hkv;
  const int warp = threadIdx.x / 32 - 1, lane = threadIdx.x % 32;
  const int seq_len = st.seq_len(r);
  const int window = ly.i(abi::L_SLIDING) ? (int)st.i(abi::S_SLIDING_WINDOW) : 0;
  const int start = window > 0 ? max(0, seq_len - window) : 0;
  const int chunk = (seq_len - start + S - 1) / S;
  const int lo = start + split * chunk, hi = min(seq_len, lo + chunk);
  float* opart = st.ptr<float>(abi::S_OPART) + (((long long)r * Hkv + g) * S + split) * G * D;
  float* lse = st.ptr<float>(abi::S_LSE) + (((long long)r * Hkv + g) * S + split) * G;

  const bf16* cache = ly.ptr<const bf16>(abi::L_KV_CACHE);
  const int* table = ly.ptr<const int>(abi::L_BLOCK_TABLE) + (long long)r * ly.i(abi::L_BLOCK_TABLE_STRIDE);
  const int bs = (int)st.i(abi::S_BLOCK_SIZE);
  const long long s_block = ly.i(abi::L_KV_STRIDE_BLOCK), s_kv = ly.i(abi::L_KV_STRIDE_KV),
                  s_tok = ly.i(abi::L_KV_STRIDE_TOKEN), s_head = ly.i(abi::L_KV_STRIDE_HEAD);
  const float scale = rsqrtf((float)D);

  for (int h = warp; h < G; h += kWorkerWarps) {
    const bf16* q = st.ptr<const bf16>(abi::S_Q) + ((long long)r * Hq + g * G + h) * D;
    float qv[kMaxHeadDimPerLane], acc[kMaxHeadDimPerLane];
#pragma unroll
    for (int j = 0; j < kMaxHeadDimPerLane; ++j) {
      const int d = lane + 32 * j;
      qv[j] = d < D ? __bfloat162float(q[d]) : 0.f;
      acc[j] = 0.f;
    }
    float m = -CUDART_INF_F, denom = 0.f;
    for (int t = lo; t < hi; ++t) {
      const long long base = (long long)table[t / bs] * s_block + (t % bs) * s_tok + g * s_head;
      const bf16* k = cache + base;
      const bf16* v = cache + base + s_kv;
      float dot = 0.f;
#pragma unroll
      for (int j = 0; j < kMaxHeadDimPerLane; ++j) {
        const int d = lane + 32 * j;
        if (d < D) dot += qv[j] * __bfloat162float(k[d]);
      }
      const float sc = warp_sum(dot) * scale;
      const float m_new = fmaxf(m, sc);
      const float corr = __expf(m - m_new), p = __expf(sc - m_new);
      denom = denom * corr + p;
#pragma unroll
      for (int j = 0; j < kMaxHeadDimPerLane; ++j) {
        const int d = lane + 32 * j;
        if (d < D) acc[j] = acc[j] * corr + p * __bfloat162float(v[d]);
      }
      m = m_new;
    }
#pragma unroll
    for (int j = 0; j < kMaxHeadDimPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < D) opart[h * D + d] = hi > lo ? acc[j] / denom : 0.f;
    }
    if (lane == 0) lse[h] = hi > lo ? m + logf(denom) : -CUDART_INF_F;
  }
}

__device__ void op_attn_combine(const Step& st, const int* desc) {
  const int r = desc[abi::F_ATTN_COMBINE_REQUEST], g = desc[abi::F_ATTN_COMBINE_KV_HEAD];
  const int S = desc[abi::F_ATTN_COMBINE_NUM_SPLITS];
  const int D = st.head_dim(), Hq = st.heads(), Hkv = st.kv_heads(), G = Hq / Hkv;
  const float* opart = st.ptr<const float>(abi::S_OPART) + ((long long)r * Hkv + g) * S * G * D;
  const float* lse = st.ptr<const float>(abi::S_LSE) + ((long long)r * Hkv + g) * S * G;
  bf16* out = st.ptr<bf16>(abi::S_ATTN) + (long long)r * Hq * D + (long long)g * G * D;
  for (int idx = threadIdx.x - 32; idx < G * D; idx += kWorkerThreads) {
    const int h = idx / D, d = idx % D;
    float m = -CUDART_INF_F;
    for (int s = 0; s < S; ++s) m = fmaxf(m, lse[s * G + h]);
    float num = 0.f, den = 0.f;
    if (m != -CUDART_INF_F) {  // all splits empty: a padding row, output zeros
      for (int s = 0; s < S; ++s) {
        const float wgt = __expf(lse[s * G + h] - m);
        num += wgt * opart[(s * G + h) * D + d];
        den += wgt;
      }
    }
    out[idx] = __float2bfloat16(den > 0.f ? num / den : 0.f);
  }
}

}  // namespace vllm_megakernel

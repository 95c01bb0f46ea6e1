// Shared by the interpreter and every opcode: typed views of the step and layer tables, bf16 helpers and
// the warp-level mma the GEMM and attention bodies are built from.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "abi.h"

namespace vllm_megakernel {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

// Eight bf16 in one 16-byte vector <-> floats.
__device__ __forceinline__ void unpack8(const uint4& v, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

__device__ __forceinline__ uint4 pack8(const float* f) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Activations are written by other SMs during the launch: plain loads (never the read-only path). The
// dependency wait's acquire orders them after the producers' writes.
__device__ __forceinline__ uint4 load16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void store16(void* p, const uint4& v) { *reinterpret_cast<uint4*>(p) = v; }

// D += A (16x16, row) * B (16x8, col), bf16 in, fp32 accumulate. Fragments as PTX lays them out:
// with g = lane / 4 and t = lane % 4, a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..],
// a3 = A[g+8][2t+8..]; b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; d0,d1 = D[g][2t..2t+1], d2,d3 = D[g+8][..].
__device__ __forceinline__ void mma_16816(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Typed view of the step table (abi::S_*), copied to shared memory once per kernel.
struct Step {
  const long long* w;
  __device__ long long i(int f) const { return w[f]; }
  __device__ double f64(int f) const { return __longlong_as_double(w[f]); }
  template <class T>
  __device__ T* ptr(int f) const { return reinterpret_cast<T*>(static_cast<uintptr_t>(w[f])); }

  __device__ int batch() const { return (int)w[abi::S_BATCH]; }
  __device__ int seq_len(int r) const { return ptr<const int>(abi::S_SEQ_LENS)[r]; }

  // The residual stream and the layer outputs alternate between two buffers by layer parity (layout.py).
  __device__ bf16* x(int layer) const { return ptr<bf16>(abi::S_X) + (long long)(layer & 1) * batch() * abi::kHidden; }
  __device__ bf16* o(int layer) const { return ptr<bf16>(abi::S_O) + (long long)(layer & 1) * batch() * abi::kHidden; }
  __device__ bf16* mlp(int layer) const {
    return ptr<bf16>(abi::S_MLP) + (long long)(layer & 1) * batch() * abi::kHidden;
  }

  // The router's scores of one layer, [batch][kNumExperts] (layout.workspace_spec keeps every layer's).
  __device__ float* scores(int layer) const {
    return ptr<float>(abi::S_SCORES) + (long long)layer * batch() * abi::kNumExperts;
  }

  // Route buffer (layout.route_offsets): num_active, slot_expert[slots], slot_count[slots], slot_rows[slots][B].
  __device__ int* route() const { return ptr<int>(abi::S_ROUTE); }
  __device__ int* slot_expert() const { return route() + w[abi::S_ROUTE_EXPERT_OFF]; }
  __device__ int* slot_count() const { return route() + w[abi::S_ROUTE_COUNT_OFF]; }
  __device__ int* slot_rows(int slot) const { return route() + w[abi::S_ROUTE_ROWS_OFF] + slot * batch(); }
  // Each layer's routed slot count, kept for the whole step (route()[0] is the latest layer's only).
  // (layout.route_offsets: right after the slot rows, so no step word of its own)
  __device__ int* layer_active() const { return slot_rows((int)w[abi::S_NUM_SLOTS]); }
  // One layer's posted route words (the step's posted_routing, abi.ROUTE_POST): [0] its routed slot count,
  // [1 + s] slot s. They sit in the step's barrier array, which the host zeroes before every launch.
  __device__ unsigned long long* route_posts(int layer) const {
    return ptr<unsigned long long>(abi::S_ROUTE_POSTS) + (long long)layer * (1 + w[abi::S_NUM_SLOTS]);
  }
  // Whether the routers post their scores as the top-k's keys and the top-k polls them (the step's posted_scores).
  __device__ bool posted_scores() const { return w[abi::S_SCORE_POSTS] != 0; }
  // One layer's posted score keys (posted_scores), [batch][kNumExperts], 0 until posted (topk::score_key). In
  // the step's barrier array too (layout.score_post_words).
  __device__ uint32_t* score_posts(int layer) const {
    return ptr<uint32_t>(abi::S_SCORE_POSTS) + (long long)layer * batch() * abi::kNumExperts;
  }
};

// Typed view of one layer's row of the layer table (abi::L_*).
struct Layer {
  const long long* w;
  __device__ long long i(int f) const { return w[f]; }
  template <class T>
  __device__ T* ptr(int f) const { return reinterpret_cast<T*>(static_cast<uintptr_t>(w[f])); }
};

}  // namespace vllm_megakernel

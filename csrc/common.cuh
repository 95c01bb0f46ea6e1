// Shared by the interpreter and every opcode: the block shape, typed views of the step and layer tables,
// bf16 helpers, warp reductions and the worker-only named barrier.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "abi.h"

namespace vllm_megakernel {

using bf16 = __nv_bfloat16;

// Block shape (the "ABI" of every opcode): warp 0 is the controller, warps 1.. are workers.
constexpr int kWarps = 12;
constexpr int kThreads = kWarps * 32;
constexpr int kWorkerWarps = kWarps - 1;
constexpr int kWorkerThreads = kWorkerWarps * 32;
constexpr int kRingSlots = 4;  // descriptors the controller may run ahead by

// Workers synchronise among themselves; __syncthreads would also wait for the controller warp.
__device__ __forceinline__ void worker_sync() {
  asm volatile("bar.sync 1, %0;" ::"r"(kWorkerThreads) : "memory");
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

// Typed view of the step table (abi::S_*), copied to shared memory once per kernel.
struct Step {
  const long long* w;
  __device__ long long i(int f) const { return w[f]; }
  __device__ double f64(int f) const { return __longlong_as_double(w[f]); }
  template <class T>
  __device__ T* ptr(int f) const { return reinterpret_cast<T*>(static_cast<uintptr_t>(w[f])); }

  __device__ int batch() const { return (int)w[abi::S_BATCH]; }
  __device__ int hidden() const { return (int)w[abi::S_HIDDEN]; }
  __device__ int heads() const { return (int)w[abi::S_NUM_HEADS]; }
  __device__ int kv_heads() const { return (int)w[abi::S_NUM_KV_HEADS]; }
  __device__ int head_dim() const { return (int)w[abi::S_HEAD_DIM]; }
  __device__ int top_k() const { return (int)w[abi::S_TOP_K]; }
  __device__ int tile_n() const { return (int)w[abi::S_TILE_N]; }
  __device__ int splits() const { return (int)w[abi::S_ATTN_SPLITS]; }
  __device__ int slots() const { return (int)w[abi::S_NUM_SLOTS]; }
  __device__ int seq_len(int r) const { return ptr<const int>(abi::S_SEQ_LENS)[r]; }

  // Route buffer: [num_active, slot_expert[slots], slot_count[slots], slot_rows[slots][batch]].
  __device__ int* route() const { return ptr<int>(abi::S_ROUTE); }
  __device__ int* slot_expert() const { return route() + 1; }
  __device__ int* slot_count() const { return route() + 1 + slots(); }
  __device__ int* slot_rows(int slot) const { return route() + 1 + 2 * slots() + slot * batch(); }
};

// Typed view of one layer's row of the layer table (abi::L_*).
struct Layer {
  const long long* w;
  __device__ long long i(int f) const { return w[f]; }
  template <class T>
  __device__ T* ptr(int f) const { return reinterpret_cast<T*>(static_cast<uintptr_t>(w[f])); }
};

}  // namespace vllm_megakernel

// One output-column tile of Y = A @ W^T for a handful of rows, on CUDA cores (v1: correct first).
//
// Every GEMM opcode (QKV, O-proj, dense FFN, router, expert up/gate and down) is this loop with its own
// rows and epilogue. A worker warp owns one output column at a time: its lanes stream that weight row
// once in 16-byte vectors and dot it against up to kRowChunk activation rows, so each weight byte is read
// from HBM once per task. Activations come from the workspace (written by other SMs in this launch), so
// they are read with plain loads, never the read-only cache path.
#pragma once

#include "../common.cuh"

namespace vllm_megakernel {

constexpr int kRowChunk = 8;

__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 p = __bfloat1622float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// For every n in [n0, n0 + ncols) and every r < nrows: epi(r, n, dot(A[row_of(r)], W[n])) over K.
// Requirements: K % 8 == 0, rows and W rows 16-byte aligned. Called by all worker threads.
template <class RowOf, class Epi>
__device__ void gemm_tile(const bf16* A, int lda, RowOf row_of, int nrows, const bf16* W, int ldw, int n0,
                          int ncols, int K, Epi epi) {
  const int warp = threadIdx.x / 32 - 1;  // worker warp index
  const int lane = threadIdx.x % 32;
  for (int n = n0 + warp; n < n0 + ncols; n += kWorkerWarps) {
    const bf16* w_row = W + (long long)n * ldw;
    for (int r0 = 0; r0 < nrows; r0 += kRowChunk) {
      float acc[kRowChunk];
#pragma unroll
      for (int j = 0; j < kRowChunk; ++j) acc[j] = 0.f;
      for (int k = lane * 8; k < K; k += 32 * 8) {
        float wf[8];
        bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(w_row + k)), wf);  // weights are immutable
#pragma unroll
        for (int j = 0; j < kRowChunk; ++j) {
          if (r0 + j < nrows) {
            const bf16* a = A + (long long)row_of(r0 + j) * lda + k;
            float af[8];
            bf16x8_to_float(*reinterpret_cast<const uint4*>(a), af);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[j] = fmaf(af[e], wf[e], acc[j]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kRowChunk; ++j) {
        float v = warp_sum(acc[j]);
        if (lane == 0 && r0 + j < nrows) epi(r0 + j, n, v);
      }
    }
  }
}

struct IdentityRow {
  __device__ int operator()(int r) const { return r; }
};

}  // namespace vllm_megakernel

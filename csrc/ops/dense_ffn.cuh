// DENSE_UPGATE and DENSE_DOWN: the SwiGLU FFN of the dense prefix layer, one column tile per task.
// gate_up_w is vLLM's merged [gate; up] weight [2I, H]; the activation is silu(gate) * up in fp32 on the
// bf16-rounded GEMM outputs, rounded once (vLLM's SiluAndMul).
#pragma once

#include "../common.cuh"
#include "gemm_tile.cuh"

namespace vllm_megakernel {

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }

__device__ void op_dense_upgate(const Step& st, const Layer& ly, const int* desc, float* smem) {
  const int T = st.tile_n(), n0 = desc[abi::F_DENSE_UPGATE_COL_TILE] * T;
  const int B = st.batch(), H = st.hidden(), I = (int)st.i(abi::S_DENSE_INTERMEDIATE);
  const bf16* hn = st.ptr<const bf16>(abi::S_HN);
  const bf16* w = ly.ptr<const bf16>(abi::L_GATE_UP_W);
  float* gate = smem;  // [B][T]
  gemm_tile(hn, H, IdentityRow{}, B, w, H, n0, T, H,
            [&](int r, int n, float v) { gate[r * T + (n - n0)] = round_bf16(v); });
  worker_sync();
  bf16* act = st.ptr<bf16>(abi::S_DACT);
  gemm_tile(hn, H, IdentityRow{}, B, w, H, I + n0, T, H, [&](int r, int n, float v) {
    const int c = n - I;
    act[(long long)r * I + c] = __float2bfloat16(silu(gate[r * T + (c - n0)]) * round_bf16(v));
  });
}

__device__ void op_dense_down(const Step& st, const Layer& ly, const int* desc) {
  const int T = st.tile_n(), n0 = desc[abi::F_DENSE_DOWN_COL_TILE] * T;
  const int H = st.hidden(), I = (int)st.i(abi::S_DENSE_INTERMEDIATE);
  bf16* mlp = st.ptr<bf16>(abi::S_MLP);
  gemm_tile(st.ptr<const bf16>(abi::S_DACT), I, IdentityRow{}, st.batch(), ly.ptr<const bf16>(abi::L_DOWN_W), I,
            n0, T, I, [&](int r, int n, float v) { mlp[(long long)r * H + n] = __float2bfloat16(v); });
}

}  // namespace vllm_megakernel

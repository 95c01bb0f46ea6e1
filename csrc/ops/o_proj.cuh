// O_PROJ: one column tile of o_out = attn_out @ Wo^T, for every row.
#pragma once

#include "../common.cuh"
#include "gemm_tile.cuh"

namespace vllm_megakernel {

__device__ void op_o_proj(const Step& st, const Layer& ly, const int* desc) {
  const int T = st.tile_n(), n0 = desc[abi::F_O_PROJ_COL_TILE] * T;
  const int H = st.hidden(), K = st.heads() * st.head_dim();
  bf16* o = st.ptr<bf16>(abi::S_O);
  gemm_tile(st.ptr<const bf16>(abi::S_ATTN), K, IdentityRow{}, st.batch(), ly.ptr<const bf16>(abi::L_O_W), K,
            n0, T, K, [&](int r, int n, float v) { o[(long long)r * H + n] = __float2bfloat16(v); });
}

}  // namespace vllm_megakernel

// EMBED_RMSNORM, ADD_RMSNORM, FINAL_NORM: the residual stream and the one RMSNorm per layer.
// One warp per batch row; each lane owns the same strided columns in both passes, so it re-reads only
// values it wrote itself. Numerics follow vLLM: the parallel block's residual is added as
// (x + attn) + mlp with bf16 rounding after each add; RMSNorm computes in fp32 and rounds once.
#pragma once

#include "../common.cuh"

namespace vllm_megakernel {

enum class NormKind { kEmbed, kAdd, kFinal };

template <NormKind kind>
__device__ void op_norm(const Step& st, const bf16* norm_w) {
  const int warp = threadIdx.x / 32 - 1, lane = threadIdx.x % 32;
  const int B = st.batch(), H = st.hidden();
  const float eps = (float)st.f64(abi::S_EPS_F64);
  bf16* x = st.ptr<bf16>(abi::S_X);
  const bf16* embed = st.ptr<const bf16>(abi::S_EMBED);
  const int* ids = st.ptr<const int>(abi::S_INPUT_IDS);
  const bf16* o = st.ptr<const bf16>(abi::S_O);
  const bf16* mlp = st.ptr<const bf16>(abi::S_MLP);
  bf16* dst = st.ptr<bf16>(kind == NormKind::kFinal ? abi::S_OUT : abi::S_HN);
  for (int r = warp; r < B; r += kWorkerWarps) {
    bf16* xr = x + (long long)r * H;
    float ss = 0.f;
    for (int i = lane; i < H; i += 32) {
      float v;
      if constexpr (kind == NormKind::kEmbed) {
        v = __bfloat162float(__ldg(embed + (long long)ids[r] * H + i));
      } else {
        const long long at = (long long)r * H + i;
        v = round_bf16(__bfloat162float(xr[i]) + __bfloat162float(o[at]));
        v = round_bf16(v + __bfloat162float(mlp[at]));
      }
      xr[i] = __float2bfloat16(v);
      ss += v * v;
    }
    const float inv = rsqrtf(warp_sum(ss) / H + eps);
    const bool zero = kind == NormKind::kFinal && st.seq_len(r) == 0;  // padding rows return zeros
    for (int i = lane; i < H; i += 32) {
      const float v = __bfloat162float(xr[i]);
      dst[(long long)r * H + i] = __float2bfloat16(zero ? 0.f : __bfloat162float(__ldg(norm_w + i)) * (v * inv));
    }
  }
}

}  // namespace vllm_megakernel

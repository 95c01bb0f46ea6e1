// O_PROJ: rows [row0, row0 + rows) of o_out = attn_out @ Wo^T (the columns of the layer's o buffer).
#pragma once

#include "gemm.cuh"

namespace vllm_megakernel {

struct OProjOp {
  static constexpr int K = abi::kNumHeads * abi::kHeadDim, RS = abi::kOStageRows;
  struct Shared {
    float part[abi::kPartialFloats];
  };

  static __device__ bool load(Producer& p, const Task& t) {
    const bf16* w = t.ly.ptr<const bf16>(abi::L_O_W) + (long long)t[abi::F_O_PROJ_ROW0] * K;
    return load_weight_rows<K, RS>(p, w, t[abi::F_O_PROJ_ROWS]);
  }

  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    const int row0 = t[abi::F_O_PROJ_ROW0], R = t[abi::F_O_PROJ_ROWS], B = c.st.batch(), bp = padded_rows(B);
    if (!gemm_task<K, RS>(c, DenseRows{c.st.ptr<const bf16>(abi::S_ATTN), K, B}, B, R, sh.part)) return false;
    bf16* o = c.st.o(t.layer()) + row0;
    store_rows(c, sh.part, R, B, bp, [&](int b) { return o + (long long)b * abi::kHidden; });
    return true;
  }
};

}  // namespace vllm_megakernel

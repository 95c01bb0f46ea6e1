// DENSE_UPGATE and DENSE_DOWN: the SwiGLU FFN of the dense prefix layer.
// gate_up_w is vLLM's merged [gate; up] weight [2I, H]: an up/gate task streams the gate rows of its
// columns, then the same columns' up rows (store_silu_mul, gemm.cuh, makes the activation).
#pragma once

#include "norm.cuh"

namespace vllm_megakernel {

struct DenseUpgateOp {
  static constexpr int K = abi::kHidden, RS = abi::kDenseUpStageRows, I = abi::kDenseIntermediate;
  struct Shared {
    float part[abi::kPartialFloats];
    NormScratch norm;
  };

  static __device__ bool load(Producer& p, const Task& t) {
    const bf16* w = t.ly.ptr<const bf16>(abi::L_GATE_UP_W);
    const int col0 = t[abi::F_DENSE_UPGATE_COL0], cols = t[abi::F_DENSE_UPGATE_COLS];
    return load_weight_rows<K, RS>(p, w + (long long)col0 * K, cols) &&
           load_weight_rows<K, RS>(p, w + (long long)(I + col0) * K, cols);
  }

  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    const int col0 = t[abi::F_DENSE_UPGATE_COL0], cols = t[abi::F_DENSE_UPGATE_COLS], R = 2 * cols;
    const int B = c.st.batch(), bp = padded_rows(B);
    if (!hidden_gemm<RS>(c, t, t[abi::F_DENSE_UPGATE_NORM] != 0, R, sh.part, sh.norm, nullptr, nullptr)) return false;
    bf16* act = c.st.ptr<bf16>(abi::S_DACT) + col0;
    store_silu_mul(c, sh.part, cols, B, bp, [&](int b) { return act + (long long)b * I; });
    return true;
  }
};

struct DenseDownOp {
  static constexpr int K = abi::kDenseIntermediate, RS = abi::kDenseDownStageRows;
  struct Shared {
    float part[abi::kPartialFloats];
  };

  static __device__ bool load(Producer& p, const Task& t) {
    const bf16* w = t.ly.ptr<const bf16>(abi::L_DOWN_W) + (long long)t[abi::F_DENSE_DOWN_ROW0] * K;
    return load_weight_rows<K, RS>(p, w, t[abi::F_DENSE_DOWN_ROWS]);
  }

  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    const int row0 = t[abi::F_DENSE_DOWN_ROW0], R = t[abi::F_DENSE_DOWN_ROWS], B = c.st.batch(), bp = padded_rows(B);
    if (!gemm_task<K, RS>(c, DenseRows{c.st.ptr<const bf16>(abi::S_DACT), K, B}, B, R, sh.part)) return false;
    bf16* mlp = c.st.mlp(t.layer()) + row0;
    store_rows<RS>(c, sh.part, R, B, bp, [&](int b) { return mlp + (long long)b * abi::kHidden; });
    return true;
  }
};

}  // namespace vllm_megakernel

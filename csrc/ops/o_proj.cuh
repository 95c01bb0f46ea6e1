// O_PROJ: rows [row0, row0 + rows) of o_out = attn_out @ Wo^T (the columns of the layer's o buffer). A task with
// batch_rows > 0 does this for batch rows [batch0, batch0 + batch_rows) only (StepShape.o_batch_split: at 17 or
// more rows the GEMM reloads its activations from L2 for every few stages, 64 rows x 4096 x 2 B = 512 KB at batch
// 64 against a task's 131 KB of weights; slices of at most 16 rows hold theirs in registers).
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
    const int row0 = t[abi::F_O_PROJ_ROW0], R = t[abi::F_O_PROJ_ROWS];
    const int b0 = t[abi::F_O_PROJ_BATCH0], split = t[abi::F_O_PROJ_BATCH_ROWS];
    const int B = split ? split : c.st.batch(), bp = padded_rows(B);  // this task's batch rows: b0 + [0, B)
    const DenseRows rows{c.st.ptr<const bf16>(abi::S_ATTN) + (long long)b0 * K, K, B};
    if (!gemm_task<K, RS>(c, rows, B, R, sh.part)) return false;
    bf16* o = c.st.o(t.layer()) + (long long)b0 * abi::kHidden + row0;
    flagged::Word* words = c.st.residual_words(abi::kResidualO, t.layer());  // StepShape.flagged_residual
    if (words) words += ((long long)b0 * abi::kHidden + row0) / 2;
    store_rows<RS>(c, sh.part, R, B, bp, [&](int b) { return o + (long long)b * abi::kHidden; }, words, t.layer());
    return true;
  }
};

}  // namespace vllm_megakernel

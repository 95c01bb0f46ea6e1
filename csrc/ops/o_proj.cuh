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

  // Weight rows [row0, ...) of the layer, as load() streams them.
  static __device__ const bf16* weight_rows(const Layer& ly, int row0) {
    return ly.ptr<const bf16>(abi::L_O_W) + (long long)row0 * K;
  }

  static __device__ bool load(Producer& p, const Task& t) {
    return load_weight_rows<K, RS>(p, weight_rows(t.ly, t[abi::F_O_PROJ_ROW0]), t[abi::F_O_PROJ_ROWS]);
  }

  // The step's o_prefetch: the rows load() will stream, asked of L2 long before (megakernel.cu's
  // prefetch_o_rows_ahead, while the SM's producer waits on its layer's routing). One lane.
  static __device__ void prefetch(const Layer& ly, int row0, int rows) {
    const uint8_t* w = reinterpret_cast<const uint8_t*>(weight_rows(ly, row0));
    const uint32_t bytes = (uint32_t)rows * K * 2;
    for (uint32_t off = 0; off < bytes; off += kStageBytes) prefetch_l2(w + off, min((uint32_t)kStageBytes, bytes - off));
  }

  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    const int row0 = t[abi::F_O_PROJ_ROW0], R = t[abi::F_O_PROJ_ROWS];
    const int b0 = t[abi::F_O_PROJ_BATCH0], split = t[abi::F_O_PROJ_BATCH_ROWS];
    const int B = split ? split : c.st.batch(), bp = padded_rows(B);  // this task's batch rows: b0 + [0, B)
    const DenseRows rows{c.st.ptr<const bf16>(abi::S_ATTN) + (long long)b0 * K, K, B};
    if (!gemm_task<K, RS>(c, rows, B, R, sh.part)) return false;
    bf16* o = c.st.o(t.layer()) + (long long)b0 * abi::kHidden + row0;
    store_rows<RS>(c, sh.part, R, B, bp, [&](int b) { return o + (long long)b * abi::kHidden; });
    return true;
  }
};

}  // namespace vllm_megakernel

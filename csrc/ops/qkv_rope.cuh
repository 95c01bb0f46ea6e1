// QKV_ROPE: rows [row0, row0 + rows) of [q;k;v] = hn @ Wqkv^T for every batch row, then interleaved (GPT-J)
// RoPE on q and k rows where the layer has it; q goes to the workspace, k and v straight into vLLM's paged
// cache at the row's slot (slot -1 = padding row: nothing is written). A task with batch_rows > 0 does this
// for batch rows [batch0, batch0 + batch_rows) only (StepShape.qkv_batch_split: more, shorter tasks where the
// grouped GEMM's cost grows with the rows). A tile never splits a RoPE pair
// (pairs are (2i, 2i+1) of a head and tiles start on even rows). The GEMM output is rounded to bf16 before
// RoPE, like vLLM's linear layer output.
#pragma once

#include "norm.cuh"

namespace vllm_megakernel {

struct QkvRopeOp {
  static constexpr int K = abi::kHidden, RS = abi::kQkvStageRows;
  struct Shared {
    float part[abi::kPartialFloats];
    NormScratch norm;
  };

  static __device__ bool load(Producer& p, const Task& t) {
    const bf16* w = t.ly.ptr<const bf16>(abi::L_QKV_W) + (long long)t[abi::F_QKV_ROPE_ROW0] * K;
    return load_weight_rows<K, RS>(p, w, t[abi::F_QKV_ROPE_ROWS]);
  }

  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    const int layer = t.layer(), row0 = t[abi::F_QKV_ROPE_ROW0], R = t[abi::F_QKV_ROPE_ROWS];
    const int b0 = t[abi::F_QKV_ROPE_BATCH0], split = t[abi::F_QKV_ROPE_BATCH_ROWS];
    const int B = split ? split : c.st.batch(), bp = padded_rows(B);  // this task's batch rows: b0 + [0, B)
    if (split) {  // a slice of the rows of hn (the schedule never folds the norm into a split task)
      const DenseRows rows{c.st.ptr<const bf16>(abi::S_HN) + (long long)b0 * K, K, B};
      if (!gemm_task<K, RS>(c, rows, B, R, sh.part)) return false;
    } else {
      bf16* store_x = t[abi::F_QKV_ROPE_WRITE_X] ? c.st.x(layer) : nullptr;
      if (!hidden_gemm<RS>(c, t, t[abi::F_QKV_ROPE_NORM] != 0, R, sh.part, sh.norm, store_x, nullptr)) return false;
    }

    constexpr int D = abi::kHeadDim, Hq = abi::kNumHeads, Hkv = abi::kNumKvHeads;
    const bool rope = t.ly.i(abi::L_ROPE) != 0;
    const float theta = (float)c.st.f64(abi::S_ROPE_THETA_F64);
    const long long* pos = c.st.ptr<const long long>(abi::S_POSITIONS);
    bf16* q = c.st.ptr<bf16>(abi::S_Q);
    bf16* cache = t.ly.ptr<bf16>(abi::L_KV_CACHE);
    const long long* slots = t.ly.ptr<const long long>(abi::L_SLOT_MAPPING);
    const int bs = (int)c.st.i(abi::S_BLOCK_SIZE);
    const long long s_block = t.ly.i(abi::L_KV_STRIDE_BLOCK), s_kv = t.ly.i(abi::L_KV_STRIDE_KV),
                    s_tok = t.ly.i(abi::L_KV_STRIDE_TOKEN), s_head = t.ly.i(abi::L_KV_STRIDE_HEAD);
    for (int idx = c.thread; idx < (R / 2) * B; idx += kConsumerThreads) {
      const int pr = idx / B, i = idx % B, b = b0 + i;  // i: the task's row, b: the batch's
      const int n = row0 + 2 * pr, head = n / D, d = n % D;
      float v0 = round_bf16(sh.part[(2 * pr) * bp + i]);
      float v1 = round_bf16(sh.part[(2 * pr + 1) * bp + i]);
      if (rope && head < Hq + Hkv) {
        const float inv_freq = 1.f / powf(theta, (float)d / D);  // theta^(-2i/D) for the pair i = d / 2
        float s, co;
        sincosf((float)pos[b] * inv_freq, &s, &co);
        const float r0 = v0 * co - v1 * s, r1 = v0 * s + v1 * co;
        v0 = r0;
        v1 = r1;
      }
      const __nv_bfloat162 pair = __floats2bfloat162_rn(v0, v1);
      if (head < Hq) {
        *reinterpret_cast<__nv_bfloat162*>(q + ((long long)b * Hq + head) * D + d) = pair;
        continue;
      }
      const long long slot = slots[b];
      if (slot < 0) continue;
      const int kv = head < Hq + Hkv ? 0 : 1, g = head - Hq - kv * Hkv;
      *reinterpret_cast<__nv_bfloat162*>(cache + (slot / bs) * s_block + kv * s_kv + (slot % bs) * s_tok +
                                         g * s_head + d) = pair;
    }
    // The new K/V is read next by the attention tasks' bulk copies (the async proxy).
    ptx::fence_proxy_async(ptx::space_global);
    return true;
  }
};

}  // namespace vllm_megakernel

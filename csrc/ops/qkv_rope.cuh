// QKV_ROPE: one head (head_dim output columns) of [q;k;v] = hn @ Wqkv^T for every row, then interleaved
// (GPT-J) RoPE on q and k when the layer has it; q goes to the workspace, k and v straight into vLLM's
// paged cache at the row's slot (slot -1 = padding row: nothing is written).
#pragma once

#include "../common.cuh"
#include "gemm_tile.cuh"

namespace vllm_megakernel {

__device__ void op_qkv_rope(const Step& st, const Layer& ly, const int* desc, float* smem) {
  const int head = desc[abi::F_QKV_ROPE_HEAD];
  const int B = st.batch(), H = st.hidden(), D = st.head_dim(), Hq = st.heads(), Hkv = st.kv_heads();
  const bf16* hn = st.ptr<const bf16>(abi::S_HN);
  const bf16* w = ly.ptr<const bf16>(abi::L_QKV_W);
  float* y = smem;  // [B][D], rounded to bf16 like vLLM's GEMM output
  gemm_tile(hn, H, IdentityRow{}, B, w, H, head * D, D, H,
            [&](int r, int n, float v) { y[r * D + (n - head * D)] = round_bf16(v); });
  worker_sync();
  const bool rotate = ly.i(abi::L_ROPE) && head < Hq + Hkv;
  const int tid = threadIdx.x - 32;
  if (rotate) {
    const float theta = (float)st.f64(abi::S_ROPE_THETA_F64);
    const long long* pos = st.ptr<const long long>(abi::S_POSITIONS);
    for (int idx = tid; idx < B * (D / 2); idx += kWorkerThreads) {
      const int r = idx / (D / 2), i = idx % (D / 2);
      const float inv_freq = 1.f / powf(theta, (2.f * i) / D);
      float s, c;
      sincosf((float)pos[r] * inv_freq, &s, &c);
      const float a = y[r * D + 2 * i], b = y[r * D + 2 * i + 1];
      y[r * D + 2 * i] = a * c - b * s;
      y[r * D + 2 * i + 1] = a * s + b * c;
    }
    worker_sync();
  }
  if (head < Hq) {
    bf16* q = st.ptr<bf16>(abi::S_Q);
    for (int idx = tid; idx < B * D; idx += kWorkerThreads) {
      const int r = idx / D, i = idx % D;
      q[((long long)r * Hq + head) * D + i] = __float2bfloat16(y[idx]);
    }
    return;
  }
  const int kv = head < Hq + Hkv ? 0 : 1;
  const int g = head - Hq - kv * Hkv;
  bf16* cache = ly.ptr<bf16>(abi::L_KV_CACHE);
  const long long* slots = ly.ptr<const long long>(abi::L_SLOT_MAPPING);
  const int bs = (int)st.i(abi::S_BLOCK_SIZE);
  const long long s_block = ly.i(abi::L_KV_STRIDE_BLOCK), s_kv = ly.i(abi::L_KV_STRIDE_KV),
                  s_tok = ly.i(abi::L_KV_STRIDE_TOKEN), s_head = ly.i(abi::L_KV_STRIDE_HEAD);
  for (int idx = tid; idx < B * D; idx += kWorkerThreads) {
    const int r = idx / D, i = idx % D;
    const long long slot = slots[r];
    if (slot < 0) continue;
    cache[(slot / bs) * s_block + kv * s_kv + (slot % bs) * s_tok + g * s_head + i] = __float2bfloat16(y[idx]);
  }
}

}  // namespace vllm_megakernel

// MOE_UPGATE, MOE_DOWN, MOE_COMBINE: the routed experts over the ROUTER's work list.
//
// Rows are (token * K + k) pairs, so every (token, expert) pair owns one row of act and expert_out and no
// two tasks write the same row. An expert task whose slot is past num_active has nothing to do; it still
// signals its barrier (the host derived the counts from the slot count, not from routing).
#pragma once

#include "../common.cuh"
#include "dense_ffn.cuh"
#include "gemm_tile.cuh"

namespace vllm_megakernel {

struct SlotRow {  // r-th row of a slot -> its (token * K + k) pair row
  const int* rows;
  __device__ int operator()(int r) const { return rows[r]; }
};

struct SlotToken {  // r-th row of a slot -> its token (row of hn)
  const int* rows;
  int K;
  __device__ int operator()(int r) const { return rows[r] / K; }
};

__device__ void op_moe_upgate(const Step& st, const Layer& ly, const int* desc, float* smem) {
  const int slot = desc[abi::F_MOE_UPGATE_SLOT];
  if (slot >= st.route()[0]) return;
  const int T = st.tile_n(), n0 = desc[abi::F_MOE_UPGATE_COL_TILE] * T;
  const int H = st.hidden(), I = (int)st.i(abi::S_MOE_INTERMEDIATE), K = st.top_k();
  const int e = st.slot_expert()[slot], count = st.slot_count()[slot];
  const int* rows = st.slot_rows(slot);
  const bf16* w = ly.ptr<const bf16>(abi::L_W13) + (long long)e * 2 * I * H;
  const bf16* hn = st.ptr<const bf16>(abi::S_HN);
  float* gate = smem;  // [count][T]
  gemm_tile(hn, H, SlotToken{rows, K}, count, w, H, n0, T, H,
            [&](int r, int n, float v) { gate[r * T + (n - n0)] = round_bf16(v); });
  worker_sync();
  bf16* act = st.ptr<bf16>(abi::S_ACT);
  gemm_tile(hn, H, SlotToken{rows, K}, count, w, H, I + n0, T, H, [&](int r, int n, float v) {
    const int c = n - I;
    act[(long long)rows[r] * I + c] = __float2bfloat16(silu(gate[r * T + (c - n0)]) * round_bf16(v));
  });
}

__device__ void op_moe_down(const Step& st, const Layer& ly, const int* desc) {
  const int slot = desc[abi::F_MOE_DOWN_SLOT];
  if (slot >= st.route()[0]) return;
  const int T = st.tile_n(), n0 = desc[abi::F_MOE_DOWN_COL_TILE] * T;
  const int H = st.hidden(), I = (int)st.i(abi::S_MOE_INTERMEDIATE);
  const int e = st.slot_expert()[slot], count = st.slot_count()[slot];
  const int* rows = st.slot_rows(slot);
  bf16* eout = st.ptr<bf16>(abi::S_EOUT);
  gemm_tile(st.ptr<const bf16>(abi::S_ACT), I, SlotRow{rows}, count,
            ly.ptr<const bf16>(abi::L_W2) + (long long)e * H * I, I, n0, T, I,
            [&](int r, int n, float v) { eout[(long long)rows[r] * H + n] = __float2bfloat16(v); });
}

__device__ void op_moe_combine(const Step& st, const int* desc) {
  const int T = st.tile_n(), n0 = desc[abi::F_MOE_COMBINE_COL_TILE] * T;
  const int B = st.batch(), H = st.hidden(), K = st.top_k();
  const float* topk_w = st.ptr<const float>(abi::S_TOPK_W);
  const bf16* eout = st.ptr<const bf16>(abi::S_EOUT);
  bf16* mlp = st.ptr<bf16>(abi::S_MLP);
  for (int idx = threadIdx.x - 32; idx < B * T; idx += kWorkerThreads) {
    const int r = idx / T, n = n0 + idx % T;
    float acc = 0.f;
    if (st.seq_len(r) > 0)  // padding rows were not routed
      for (int k = 0; k < K; ++k) acc += topk_w[r * K + k] * __bfloat162float(eout[(long long)(r * K + k) * H + n]);
    mlp[(long long)r * H + n] = __float2bfloat16(acc);
  }
}

}  // namespace vllm_megakernel

// The residual stream and the one RMSNorm per layer.
//
// x_l is the embedding on layer 0, else (x + o) + mlp of layer l - 1, rounded to bf16 after each add (the
// order vLLM adds the parallel block in); hn_l = bf16(norm_w * (x_l * rsqrt(mean(x_l^2) + eps))) in fp32.
//
// Two ways to run it (layout.fold_norm): batches below 16 (a batch that fits the GEMM's register tiles can)
// fold it into the tasks that read hn (load_normed: each QKV / router / dense up task computes its warp
// slices of x_l and hn_l itself, one consumer_sync to add up the sum of squares, and one task of the wave
// stores x_l or hn); larger batches run NORM tasks over row chunks first. NORM with `final` set is the
// model's final norm (its output rows of padding requests are zeros). With StepShape.combine_in_norm a NORM
// task takes one row on every consumer warp and sums the previous MoE layer's expert outputs itself (moe).
#pragma once

#include "gemm.cuh"
#include "moe.cuh"

namespace vllm_megakernel {

// Sum of squares of eight bf16 values, in fp32.
__device__ __forceinline__ float sumsq8(const uint4& v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    ss = fmaf(f.x, f.x, fmaf(f.y, f.y, ss));
  }
  return ss;
}

// (x + o) + m on eight bf16 values with a bf16 rounding after each add: a bf16 add rounds the exact sum
// once, which is what rounding the fp32 sum of two bf16 values gives (vLLM adds in bf16).
__device__ __forceinline__ uint4 residual_add8(const uint4& x, const uint4& o, const uint4& m) {
  uint4 r;
  const __nv_bfloat162* hx = reinterpret_cast<const __nv_bfloat162*>(&x);
  const __nv_bfloat162* ho = reinterpret_cast<const __nv_bfloat162*>(&o);
  const __nv_bfloat162* hm = reinterpret_cast<const __nv_bfloat162*>(&m);
  __nv_bfloat162* hr = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) hr[i] = __hadd2(__hadd2(hx[i], ho[i]), hm[i]);
  return r;
}

// bf16(w * (x * inv)) on eight values, in fp32 (the RMSNorm's scale).
__device__ __forceinline__ uint4 scale8(const uint4& x, const uint4& w, float inv) {
  uint4 r;
  const __nv_bfloat162* hx = reinterpret_cast<const __nv_bfloat162*>(&x);
  const __nv_bfloat162* hw = reinterpret_cast<const __nv_bfloat162*>(&w);
  __nv_bfloat162* hr = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fx = __bfloat1622float2(hx[i]), fw = __bfloat1622float2(hw[i]);
    hr[i] = __floats2bfloat162_rn(fw.x * (fx.x * inv), fw.y * (fx.y * inv));
  }
  return r;
}

// N eight-column vectors of x_l for batch row b, at columns col(j), as bf16; returns their sum of squares.
// Every load is issued before the first one is used (the loads are the whole cost: one round trip to L2),
// and the arithmetic stays on packed bf16 pairs: this code runs once per layer per SM, cold in the
// instruction cache, so its length is its latency.
template <int N, class Col>
__device__ __forceinline__ float residual_vectors(const Step& st, int layer, int b, Col col, uint4 (&v)[N]) {
  float ss = 0.f;
  if (layer == 0) {
    const int id = st.ptr<const int>(abi::S_INPUT_IDS)[b];
    const bf16* row = st.ptr<const bf16>(abi::S_EMBED) + (long long)id * abi::kHidden;
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = __ldg(reinterpret_cast<const uint4*>(row + col(j)));
  } else {
    const long long at = (long long)b * abi::kHidden;
    const bf16 *x = st.x(layer - 1) + at, *o = st.o(layer - 1) + at, *m = st.mlp(layer - 1) + at;
    uint4 ov[N], mv[N];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      v[j] = load16(x + col(j));
      ov[j] = load16(o + col(j));
      mv[j] = load16(m + col(j));
    }
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = residual_add8(v[j], ov[j], mv[j]);
  }
#pragma unroll
  for (int j = 0; j < N; ++j) ss += sumsq8(v[j]);
  return ss;
}

// residual_vectors where the previous layer's MOE_COMBINE is folded into this norm (NORM's moe = 1): each
// mlp vector is summed here from expert_out and topk_w by MoeCombineOp's combine_experts8 (zero for a
// padding row, which was not routed), then (x + o) + mlp as above. Every load is issued before the first sum.
template <int N, class Col>
__device__ __forceinline__ float residual_vectors_moe(const Step& st, int layer, int b, Col col, uint4 (&v)[N]) {
  constexpr int KT = abi::kTopK;
  const long long at = (long long)b * abi::kHidden;
  const bf16 *x = st.x(layer - 1) + at, *o = st.o(layer - 1) + at;
  const bf16* eout = st.ptr<const bf16>(abi::S_EOUT) + at * KT;
  const float* topk_w = st.ptr<const float>(abi::S_TOPK_W) + b * KT;
  const bool live = st.seq_len(b) > 0;
  uint4 ov[N], ev[N][KT];
  float w[KT];
#pragma unroll
  for (int j = 0; j < N; ++j) {
    v[j] = load16(x + col(j));
    ov[j] = load16(o + col(j));
  }
  // a padding row's loads too (the buffers span every row; no branch around them): its sums are dropped below
#pragma unroll
  for (int k = 0; k < KT; ++k) {
    w[k] = topk_w[k];
#pragma unroll
    for (int j = 0; j < N; ++j) ev[j][k] = load16(eout + (long long)k * abi::kHidden + col(j));
  }
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const uint4 m = combine_experts8(w, ev[j]);
    v[j] = residual_add8(v[j], ov[j], live ? m : make_uint4(0, 0, 0, 0));
    ss += sumsq8(v[j]);
  }
  return ss;
}

struct NormScratch {
  float sumsq[kConsumerWarps][kMaxRegisterRows];
};

// The warp's register slice of hn_l for batch rows g (+8), computed from the residual stream. Stores x_l
// (store_x) or hn_l (store_hn) for those rows and columns when asked. Contains a consumer_sync.
template <int MH>
__device__ void load_normed(ActTile<abi::kHidden, MH>& a, const Consumer& c, const Task& t, NormScratch& sh,
                            bf16* store_x, bf16* store_hn) {
  using Tile = ActTile<abi::kHidden, MH>;
  const int B = c.st.batch(), layer = t.layer(), g = c.lane >> 2;
  const auto col = [&](int k) { return Tile::col(c.warp, c.lane, k); };
  // The norm weights of this lane's columns, issued with the residual loads below: one round trip to L2
  // for both (issued after them, they were a second one on every layer's critical path).
  const bf16* w = t.ly.ptr<const bf16>(abi::L_NORM_W);
  uint4 wv[Tile::KCH];
#pragma unroll
  for (int k = 0; k < Tile::KCH; ++k) wv[k] = __ldg(reinterpret_cast<const uint4*>(w + col(k)));
#pragma unroll
  for (int h = 0; h < MH; ++h) {
    const int b = g + 8 * h;
    float ss = 0.f;
    if (b < B) {
      ss = residual_vectors<Tile::KCH>(c.st, layer, b, col, a.v[h]);
      if (store_x)
#pragma unroll
        for (int k = 0; k < Tile::KCH; ++k) store16(store_x + (long long)b * abi::kHidden + col(k), a.v[h][k]);
    } else {
#pragma unroll
      for (int k = 0; k < Tile::KCH; ++k) a.v[h][k] = make_uint4(0, 0, 0, 0);
    }
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);
    ss += __shfl_xor_sync(0xffffffffu, ss, 2);
    if ((c.lane & 3) == 0) sh.sumsq[c.warp][b] = ss;
  }
  consumer_sync();
  const float eps = (float)c.st.f64(abi::S_EPS_F64);
#pragma unroll
  for (int h = 0; h < MH; ++h) {
    const int b = g + 8 * h;
    if (b >= B) continue;
    float total = 0.f;
#pragma unroll
    for (int ww = 0; ww < kConsumerWarps; ++ww) total += sh.sumsq[ww][b];
    const float inv = rsqrtf(total / abi::kHidden + eps);
#pragma unroll
    for (int k = 0; k < Tile::KCH; ++k) {
      a.v[h][k] = scale8(a.v[h][k], wv[k], inv);
      if (store_hn) store16(store_hn + (long long)b * abi::kHidden + col(k), a.v[h][k]);
    }
  }
}

// A GEMM over K = hidden whose activation rows are hn_l computed on the fly (batch <= 16). Leaves the
// sums as gemm_task does.
template <int RS>
__device__ bool normed_gemm(Consumer& c, const Task& t, int R, float* part, NormScratch& sh, bf16* store_x,
                            bf16* store_hn) {
  const int B = c.st.batch(), bp = padded_rows(B), nstages = R / RS;
  if (B <= 8) {
    ActTile<abi::kHidden, 1> a;
    load_normed(a, c, t, sh, store_x, store_hn);
    return gemm_stages<abi::kHidden, RS, 1>(c, a, nstages, part, R, bp);
  }
  ActTile<abi::kHidden, 2> a;
  load_normed(a, c, t, sh, store_x, store_hn);
  return gemm_stages<abi::kHidden, RS, 2>(c, a, nstages, part, R, bp);
}

// Activation rows of a hidden-wide GEMM: hn_l folded in (norm) or read from the workspace.
template <int RS>
__device__ bool hidden_gemm(Consumer& c, const Task& t, bool norm, int R, float* part, NormScratch& sh,
                            bf16* store_x, bf16* store_hn) {
  if (norm) return normed_gemm<RS>(c, t, R, part, sh, store_x, store_hn);
  const int B = c.st.batch();
  return gemm_task<abi::kHidden, RS>(c, DenseRows{c.st.ptr<const bf16>(abi::S_HN), abi::kHidden, B}, B, R, part);
}

// NORM: row_warps (1 or all 8) consumer warps per batch row of the task's rows (8 rows, or one). With 8 a
// warp takes an eighth of the row's columns and the warps add their sums of squares through shared memory
// (in warp order) after one consumer_sync, which every consumer warp reaches: the moe form's 8 expert
// vectors for each of a lane's column vectors stay in registers at one vector a lane, not at eight.
struct NormOp {
  struct Shared {
    float sumsq[kConsumerWarps];
  };
  static __device__ bool load(Producer&, const Task&) { return true; }
  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    return t[abi::F_NORM_ROW_WARPS] == kConsumerWarps ? rows<kConsumerWarps>(c, t, sh) : rows<1>(c, t, sh);
  }

  template <int RW>
  static __device__ bool rows(Consumer& c, const Task& t, Shared& sh) {
    static_assert(kConsumerWarps % RW == 0, "a row's warps divide the consumer warps");
    static_assert(abi::kHidden % (32 * 8 * RW) == 0, "a row splits into whole 16-byte vectors per lane");
    constexpr int kPerLane = abi::kHidden / (32 * 8 * RW);  // 16-byte vectors per lane
    const int r = c.warp / RW, part = c.warp % RW;
    const bool mine = r < t[abi::F_NORM_ROWS];
    if (RW == 1 && !mine) return true;  // no barrier below to keep the warp for
    const int b = t[abi::F_NORM_ROW0] + r, layer = t.layer();
    const bool final = t[abi::F_NORM_FINAL] != 0, moe = RW > 1 && t[abi::F_NORM_MOE] != 0;
    const auto col = [&](int j) { return ((part * kPerLane + j) * 32 + c.lane) * 8; };
    const bf16* w = final ? c.st.ptr<const bf16>(abi::S_FINAL_NORM) : t.ly.ptr<const bf16>(abi::L_NORM_W);
    uint4 v[kPerLane], wv[kPerLane];
    float ss = 0.f;
    if (mine) {
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) wv[j] = __ldg(reinterpret_cast<const uint4*>(w + col(j)));
      // the moe form only at 8 warps a row (the schedule pairs them): at fewer its vectors a lane spill
      if constexpr (RW > 1)
        ss = moe ? residual_vectors_moe<kPerLane>(c.st, layer, b, col, v)
                 : residual_vectors<kPerLane>(c.st, layer, b, col, v);
      else
        ss = residual_vectors<kPerLane>(c.st, layer, b, col, v);
    }
    ss = warp_sum(ss);
    if (RW > 1) {
      if (c.lane == 0) sh.sumsq[c.warp] = ss;
      consumer_sync();
      ss = 0.f;
#pragma unroll
      for (int i = 0; i < RW; ++i) ss += sh.sumsq[r * RW + i];
    }
    if (!mine) return true;
    const float inv = rsqrtf(ss / abi::kHidden + (float)c.st.f64(abi::S_EPS_F64));
    bf16* dst = c.st.ptr<bf16>(final ? abi::S_OUT : abi::S_HN) + (long long)b * abi::kHidden;
    bf16* x = c.st.x(layer) + (long long)b * abi::kHidden;
    const bool zero = final && c.st.seq_len(b) == 0;  // padding rows return zeros
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      store16(x + col(j), v[j]);
      store16(dst + col(j), zero ? make_uint4(0, 0, 0, 0) : scale8(v[j], wv[j], inv));
    }
    return true;
  }
};

}  // namespace vllm_megakernel

// ATTN_PARTIAL and ATTN_COMBINE: split-KV paged decode attention over vLLM's cache and block tables.
//
// A (request, split) task attends every query head of the request over a run of 16-token tiles of its
// visible keys (positions [seq_len - W, seq_len) on sliding layers, [0, seq_len) on full layers). The
// split is evaluated on the live seq_len with layout.attn_split_tiles' formula (AttnSplit below) by the
// producer, the consumers and the combine alike: the visible tiles are cut into equal runs of at least
// attn_min_tiles (and, with attn_live_splits, long enough that at most that many are in use, up to
// attn_max_tiles), so short contexts use few splits and the tasks past them neither wait nor compute (and
// write nothing: the combine reads only the splits in use).
//
// Producer: one stage per tile, K then V of all 4 KV heads: vLLM's layout (block, K/V, token, head, dim)
// makes the 16 tokens of a block one contiguous 16 KB run of K and one of V, so a stage is two bulk copies
// (more when blocks are smaller than a tile). History tiles are loaded without waiting for anything; the
// tile holding the new token waits for the layer's qkv first (the descriptor's load_wait).
//
// Consumers: warp w scores the 8 query heads of KV head w / 2 on the tiles of parity w % 2, on tensor cores
// from the staged tile: S = Q K^T with the heads as the 16-row A operand (8 real rows) and 8 tokens as
// the B operand, online softmax in fp32 (exp2 domain), then O += P V with P as the A operand (the S
// fragment layout is P's A fragment layout) and V through ldmatrix.trans. The two parities of a head group
// merge through shared memory at the end. Masked positions (before the window, past the sequence) get
// score -inf and their V entries are zeroed in registers, so whatever the cache holds there (NaN in
// never-written slots) cannot leak into the sums.
#pragma once

#include <math_constants.h>

#include "../task.cuh"

namespace vllm_megakernel {

constexpr int kTile = abi::kAttnTileTokens;
constexpr int kTokenBytes = abi::kNumKvHeads * abi::kHeadDim * 2;  // one token of K (or V), every KV head
constexpr int kHeadsPerGroup = abi::kNumHeads / abi::kNumKvHeads;
static_assert(kTile == 16 && kHeadsPerGroup == 8 && abi::kNumKvHeads * 2 == kConsumerWarps,
              "the attention body maps 8 query heads x 16 tokens onto mma tiles, two warps per KV head");
static_assert(2 * kTile * kTokenBytes <= kStageBytes, "a tile's K and V fit one stage");

// layout.attn_split_tiles on the device.
struct AttnSplit {
  int start, end;  // visible positions [start, end)
  int first, per, used;
  __device__ static AttnSplit of(const Step& st, const Layer& ly, int request) {
    AttnSplit a;
    a.end = st.seq_len(request);
    const int window = ly.i(abi::L_SLIDING) ? (int)st.i(abi::S_SLIDING_WINDOW) : 0;
    a.start = window > 0 ? max(0, a.end - window) : 0;
    if (a.end <= a.start) {
      a.first = a.per = a.used = 0;
      return a;
    }
    a.first = a.start / kTile;
    const int n = (a.end + kTile - 1) / kTile - a.first;
    const int splits = (int)st.i(abi::S_ATTN_SPLITS);
    a.per = max((int)st.i(abi::S_ATTN_MIN_TILES), (n + splits - 1) / splits);
    const int live = (int)st.i(abi::S_ATTN_LIVE_SPLITS);
    if (live > 0) a.per = max(a.per, min((n + live - 1) / live, (int)st.i(abi::S_ATTN_MAX_TILES)));
    a.used = (n + a.per - 1) / a.per;
    return a;
  }
  __device__ int tile0(int split) const { return first + split * per; }
  __device__ int tile1(int split) const { return min((end + kTile - 1) / kTile, first + (split + 1) * per); }
};

struct AttnPartialOp {
  struct Shared {  // the odd-parity warps' state, handed to the even ones
    float o[abi::kNumKvHeads][kHeadsPerGroup][abi::kHeadDim];
    float m[abi::kNumKvHeads][kHeadsPerGroup];
    float l[abi::kNumKvHeads][kHeadsPerGroup];
  };

  // Splits past the request's visible keys (short contexts, padding rows) have nothing to do.
  static __device__ bool has_work(const Step& st, const Task& t) {
    return t[abi::F_ATTN_PARTIAL_SPLIT] < AttnSplit::of(st, t.ly, t[abi::F_ATTN_PARTIAL_REQUEST]).used;
  }

  static __device__ bool load(Producer& p, const Task& t) {
    const int r = t[abi::F_ATTN_PARTIAL_REQUEST], split = t[abi::F_ATTN_PARTIAL_SPLIT];
    const AttnSplit a = AttnSplit::of(p.st, t.ly, r);
    if (split >= a.used) return true;
    const bf16* cache = t.ly.ptr<const bf16>(abi::L_KV_CACHE);
    const int* table = t.ly.ptr<const int>(abi::L_BLOCK_TABLE) + (long long)r * t.ly.i(abi::L_BLOCK_TABLE_STRIDE);
    const int bs = (int)p.st.i(abi::S_BLOCK_SIZE);
    const long long s_block = t.ly.i(abi::L_KV_STRIDE_BLOCK), s_kv = t.ly.i(abi::L_KV_STRIDE_KV),
                    s_tok = t.ly.i(abi::L_KV_STRIDE_TOKEN);
    const int new_tile = (a.end - 1) / kTile, last_block = (a.end - 1) / bs;
    for (int tile = a.tile0(split); tile < a.tile1(split); ++tile) {
      if (tile == new_tile && !p.load_wait(t)) return false;
      uint8_t* dst = p.stages.begin(2 * kTile * kTokenBytes);
      if (!dst) return false;
      const int pos0 = tile * kTile;
      // Blocks of at least a tile: the tile is a run of one block. Smaller blocks: one copy per block; blocks
      // past the sequence's last one (their table entries may be anything) repeat that one, masked anyway.
      const int run = min(bs, kTile);
      for (int i = 0; i < kTile / run; ++i) {
        const int pos = pos0 + i * run;
        const long long src = (long long)table[min(pos / bs, last_block)] * s_block + (pos % bs) * s_tok;
        p.stages.copy_read_once(dst + i * run * kTokenBytes, cache + src, run * kTokenBytes);
        p.stages.copy_read_once(dst + kTile * kTokenBytes + i * run * kTokenBytes, cache + src + s_kv, run * kTokenBytes);
      }
      p.stages.end();
    }
    return true;
  }

  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    const int r = t[abi::F_ATTN_PARTIAL_REQUEST], split = t[abi::F_ATTN_PARTIAL_SPLIT];
    const AttnSplit a = AttnSplit::of(c.st, t.ly, r);
    if (split >= a.used) return true;
    constexpr int D = abi::kHeadDim;
    const int grp = c.warp >> 1, parity = c.warp & 1, g = c.lane >> 2, tq = c.lane & 3;
    // Q of head grp*8 + g, columns c*32 + tq*8 .. +8: the A fragments of both mmas of chunk c.
    const bf16* qrow = c.st.ptr<const bf16>(abi::S_Q) + ((long long)r * abi::kNumHeads + grp * kHeadsPerGroup + g) * D;
    uint4 qf[D / 32];
#pragma unroll
    for (int k = 0; k < D / 32; ++k) qf[k] = load16(qrow + k * 32 + tq * 8);
    c.mark_inputs();
    const float scale = 1.4426950408889634f * rsqrtf((float)D);  // log2(e) / sqrt(D): softmax in exp2
    float m = -CUDART_INF_F, l = 0.f;
    float acc[D / 8][4] = {};
    const int t0 = a.tile0(split), ntiles = a.tile1(split) - t0;
    for (int k = 0; k < ntiles; ++k) {
      const uint8_t* stage = c.stages.wait();
      if (!stage) return false;
      if ((k & 1) == parity) {
        const int pos0 = (t0 + k) * kTile;
        // S = Q K^T: rows = heads (8 real), columns = tokens nt*8 + 0..7
        float s[2][4] = {};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const uint8_t* krow = stage + (nt * 8 + g) * kTokenBytes + grp * D * 2 + tq * 16;
#pragma unroll
          for (int kc = 0; kc < D / 32; ++kc) {
            const uint4 kv = *reinterpret_cast<const uint4*>(krow + kc * 64);
            mma_16816(s[nt], qf[kc].x, 0u, qf[kc].y, 0u, kv.x, kv.y);
            mma_16816(s[nt], qf[kc].z, 0u, qf[kc].w, 0u, kv.z, kv.w);
          }
        }
        // this lane's tokens: nt*8 + 2tq + j
        bool valid[2][2];
        float mx = -CUDART_INF_F;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int pos = pos0 + nt * 8 + 2 * tq + j;
            valid[nt][j] = pos >= a.start && pos < a.end;
            s[nt][j] = valid[nt][j] ? s[nt][j] * scale : -CUDART_INF_F;
            mx = fmaxf(mx, s[nt][j]);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m, mx);  // finite: every tile holds a visible position
        const float corr = exp2f(m - m_new);
        float p[2][2];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int j = 0; j < 2; ++j) p[nt][j] = exp2f(s[nt][j] - m_new);
        l = l * corr + (p[0][0] + p[0][1] + p[1][0] + p[1][1]);
        m = m_new;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          acc[dt][0] *= corr;
          acc[dt][1] *= corr;
        }
        const uint32_t pa0 = pack2(p[0][0], p[0][1]), pa2 = pack2(p[1][0], p[1][1]);
        const uint32_t mask0 = (valid[0][0] ? 0x0000ffffu : 0u) | (valid[0][1] ? 0xffff0000u : 0u);
        const uint32_t mask1 = (valid[1][0] ? 0x0000ffffu : 0u) | (valid[1][1] ? 0xffff0000u : 0u);
        // O += P V: V rows are tokens; ldmatrix.trans hands each lane tokens (2tq, 2tq+1) / (8+2tq, 9+2tq) of
        // dims 16*dp + g (first two matrices) and 16*dp + 8 + g (last two).
        const uint8_t* vbase = stage + kTile * kTokenBytes + (((c.lane >> 3) & 1) * 8 + (c.lane & 7)) * kTokenBytes +
                               grp * D * 2 + (c.lane >> 4) * 16;
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t v0, v1, v2, v3;
          const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(vbase + dp * 32));
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                       : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                       : "r"(addr));
          mma_16816(acc[2 * dp], pa0, 0u, pa2, 0u, v0 & mask0, v1 & mask1);
          mma_16816(acc[2 * dp + 1], pa0, 0u, pa2, 0u, v2 & mask0, v3 & mask1);
        }
      }
      c.stages.release();
    }
    c.mark_stages();
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (parity == 1) {
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        sh.o[grp][g][dt * 8 + 2 * tq] = acc[dt][0];
        sh.o[grp][g][dt * 8 + 2 * tq + 1] = acc[dt][1];
      }
      if (tq == 0) {
        sh.m[grp][g] = m;
        sh.l[grp][g] = l;
      }
    }
    consumer_sync();
    if (parity == 0) {
      const float m1 = sh.m[grp][g], l1 = sh.l[grp][g];
      const float mm = fmaxf(m, m1);  // finite: the even warps always had the split's first tile
      const float w0 = m == -CUDART_INF_F ? 0.f : exp2f(m - mm), w1 = m1 == -CUDART_INF_F ? 0.f : exp2f(m1 - mm);
      const float total = l * w0 + l1 * w1, inv = 1.f / total;
      const int S = (int)c.st.i(abi::S_ATTN_SPLITS), head = grp * kHeadsPerGroup + g;
      const long long at = ((long long)r * S + split) * abi::kNumHeads + head;
      float* out = c.st.ptr<float>(abi::S_OPART) + at * D;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const int d = dt * 8 + 2 * tq;
        *reinterpret_cast<float2*>(out + d) = make_float2((acc[dt][0] * w0 + sh.o[grp][g][d] * w1) * inv,
                                                          (acc[dt][1] * w0 + sh.o[grp][g][d + 1] * w1) * inv);
      }
      // log-sum-exp in natural-log units of the unscaled softmax: (m + log2(total)) * ln 2
      if (tq == 0) c.st.ptr<float>(abi::S_LSE)[at] = (mm + log2f(total)) * 0.6931471805599453f;
    }
    return true;
  }
};

// ATTN_COMBINE: merges the splits in use of one request's query heads [head0, head0 + heads) into attn_out
// (bf16, [B, Hq * D]); a padding row (no visible keys) gets zeros. Per head the splits are spread over the
// warps (each lane owns 4 of the 128 columns), so the many splits of a long context at batch 1 are read in
// parallel rather than one after another. A task of many heads over few splits (at least 4 heads, at most
// kByColumnMaxSplits in use: batch 9 and up) takes one float4 of one head's output a thread instead (combine_by_column): the heads one
// after another cost a task ~10 us at batch 64 in dependent round trips and four consumer barriers a head.
struct AttnCombineOp {
  struct Shared {
    float weight[abi::kMaxAttnSplits];
    float part[kConsumerWarps][abi::kHeadDim];
    float warp_max[kConsumerWarps];
    float warp_den[kConsumerWarps];
  };
  static __device__ bool load(Producer&, const Task&) { return true; }
  static __device__ bool compute(Consumer& c, const Task& t, Shared& sh) {
    constexpr int D = abi::kHeadDim, Hq = abi::kNumHeads;
    static_assert(D == 4 * 32, "a lane owns 4 columns of a head");
    const int r = t[abi::F_ATTN_COMBINE_REQUEST], head0 = t[abi::F_ATTN_COMBINE_HEAD0];
    const int heads = t[abi::F_ATTN_COMBINE_HEADS];
    const int used = AttnSplit::of(c.st, t.ly, r).used, S = (int)c.st.i(abi::S_ATTN_SPLITS);
    const float* lse = c.st.ptr<const float>(abi::S_LSE) + (long long)r * S * Hq;
    const float* opart = c.st.ptr<const float>(abi::S_OPART) + (long long)r * S * Hq * D;
    bf16* out = c.st.ptr<bf16>(abi::S_ATTN) + (long long)r * Hq * D;
    if (used == 0) {
      for (int i = c.thread; i < heads * D; i += kConsumerThreads) out[head0 * D + i] = __float2bfloat16(0.f);
      return true;
    }
    if (used <= kByColumnMaxSplits && heads * (D / 4) >= kConsumerThreads / 2) {
      combine_by_column(c, lse, opart, out, head0, heads, used);
      return true;
    }
    for (int h = head0; h < head0 + heads; ++h) {
      float mx = -CUDART_INF_F;
      for (int s = c.thread; s < used; s += kConsumerThreads) mx = fmaxf(mx, lse[s * Hq + h]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      if (c.lane == 0) sh.warp_max[c.warp] = mx;
      consumer_sync();
      mx = sh.warp_max[0];
#pragma unroll
      for (int w = 1; w < kConsumerWarps; ++w) mx = fmaxf(mx, sh.warp_max[w]);
      float den = 0.f;
      for (int s = c.thread; s < used; s += kConsumerThreads) {
        const float w = __expf(lse[s * Hq + h] - mx);
        sh.weight[s] = w;
        den += w;
      }
      den = warp_sum(den);
      if (c.lane == 0) sh.warp_den[c.warp] = den;
      consumer_sync();
      // The trace's phase marks, on the task's first head: "inputs" ends once the splits' weights are known
      // (the lse loads and two barriers), "stages" once the partial outputs are summed (before the last
      // barrier and the store). A traced batch-1 task (1 head, 128 splits) ran 6.3 us with no phase of it
      // known; loading the outputs earlier did not shorten it (PERF_LOG #82).
      if (h == head0) c.mark_inputs();
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
      for (int s = c.warp; s < used; s += kConsumerWarps) {
        const float w = sh.weight[s];
        const float4 v = *reinterpret_cast<const float4*>(opart + ((long long)s * Hq + h) * D + 4 * c.lane);
        acc.x += w * v.x;
        acc.y += w * v.y;
        acc.z += w * v.z;
        acc.w += w * v.w;
      }
      *reinterpret_cast<float4*>(&sh.part[c.warp][4 * c.lane]) = acc;
      if (h == head0) c.mark_stages();
      consumer_sync();
      if (c.thread < D) {
        float num = 0.f, total = 0.f;
#pragma unroll
        for (int w = 0; w < kConsumerWarps; ++w) {
          num += sh.part[w][c.thread];
          total += sh.warp_den[w];
        }
        out[h * D + c.thread] = __float2bfloat16(num / total);
      }
      consumer_sync();  // the next head reuses the scratch
    }
    return true;
  }

  static constexpr int kByColumnMaxSplits = 16;
  // Each thread merges the splits for 4 columns of one head on its own: the splits' largest log-sum-exp, then
  // their partial outputs weighted by exp(lse - max), in split order; no shared memory, no barrier, and the
  // heads' loads all in flight at once.
  static __device__ void combine_by_column(const Consumer& c, const float* lse, const float* opart, bf16* out,
                                           int head0, int heads, int used) {
    constexpr int D = abi::kHeadDim, Hq = abi::kNumHeads, Q = D / 4;
    for (int i = c.thread; i < heads * Q; i += kConsumerThreads) {
      const int h = head0 + i / Q, col = (i % Q) * 4;
      float mx = -CUDART_INF_F;
      for (int s = 0; s < used; ++s) mx = fmaxf(mx, lse[s * Hq + h]);
      float den = 0.f;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
      for (int s = 0; s < used; ++s) {
        const float w = __expf(lse[s * Hq + h] - mx);
        const float4 v = *reinterpret_cast<const float4*>(opart + ((long long)s * Hq + h) * D + col);
        den += w;
        acc.x += w * v.x;
        acc.y += w * v.y;
        acc.z += w * v.z;
        acc.w += w * v.w;
      }
      const float inv = 1.f / den;
      __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out + h * D + col);
      o[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
      o[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
    }
  }
};

}  // namespace vllm_megakernel

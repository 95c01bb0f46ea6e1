// The GEMM engine every projection runs on: Y[b, n] = sum_k A[b, k] W[n, k] for a task's weight rows n.
//
// Producer: a task's weight rows are contiguous runs (R rows of length K are R*K*2 bytes), streamed as
// stages of RS whole rows, one bulk copy each (RS from layout.rows_per_stage, <= 32 KB).
//
// Consumers: tensor-core mma.sync m16n8k16 with the batch rows as the 16-row A operand (rows 0-7 in the
// fragment's first half, 8-15 in the second) and 8 weight rows as the 8-column B operand, fp32 accumulate.
// The K dimension is split over the consumer warps: warp w owns columns [w*K/8, (w+1)*K/8) of every weight
// row, so it loads its slice of the activation rows into registers once per task and streams every
// stage's slice of every row against them; a task's sums are reduced over the warps through shared
// memory at the end (fp32, in a fixed order), leaving one sum per (weight row, batch row). Inside a
// 32-column chunk each lane takes 8 contiguous columns (one 16-byte load from the weight row, one from the
// activation row) and feeds them to two mmas as the k-indices {2t, 2t+1, 2t+8, 2t+9} of the fragment
// layout: the dot product does not depend on the order of k, as long as A and B agree, and they do since
// both come from the same columns.
//
// Batches of at most 16 rows keep the activation slice in registers for the whole task; larger ones reload
// each 16-row group's slice from L2 once per few stages held together and add up the warps after them
// (gemm_stages_grouped). layout.gemm_tiles sizes tasks so that either form fits abi::kPartialFloats.
#pragma once

#include "../task.cuh"

namespace vllm_megakernel {

// ---- producer side

// Streams `nrows` weight rows of length K starting at `rows` (nrows a multiple of RS).
template <int K, int RS>
__device__ bool load_weight_rows(Producer& p, const bf16* rows, int nrows) {
  constexpr uint32_t kBytes = RS * K * 2;
  static_assert(kBytes <= kStageBytes, "a stage is at most one buffer");
  for (int r = 0; r < nrows; r += RS) {
    uint8_t* dst = p.stages.begin(kBytes);
    if (!dst) return false;
    p.stages.copy_read_once(dst, rows + (long long)r * K, kBytes);
    p.stages.end();
  }
  return true;
}

// ---- consumer side

constexpr int kMaxRegisterRows = 16;

__device__ __forceinline__ int padded_rows(int n) { return n <= 8 ? 8 : n <= 16 ? 16 : (n + 15) / 16 * 16; }

// A warp's slice of up to 16 activation rows: v[h][c] holds row g + 8h, columns
// (warp * KCH + c) * 32 + t * 8 .. +8 (g = lane / 4, t = lane % 4). W: the warps K is split over, the kernel's
// consumer warps (benchmarks/candidates/stage-pace-probe times this body with other counts).
template <int K, int MH, int W = kConsumerWarps>
struct ActTile {
  static constexpr int KCH = K / (32 * W);
  static_assert(K % (32 * W) == 0, "K must split into 32-column chunks over the consumer warps");
  uint4 v[MH][KCH];

  __device__ __forceinline__ static int col(int warp, int lane, int c) {
    return (warp * KCH + c) * 32 + (lane & 3) * 8;
  }

  // Rows from `src.row(b)` (nullptr: a zero row), b = row0 + g + 8h.
  template <class Src>
  __device__ void load(const Src& src, int row0, int warp, int lane) {
#pragma unroll
    for (int h = 0; h < MH; ++h) {
      const bf16* p = src.row(row0 + (lane >> 2) + 8 * h);
#pragma unroll
      for (int c = 0; c < KCH; ++c) v[h][c] = p ? load16(p + col(warp, lane, c)) : make_uint4(0, 0, 0, 0);
    }
  }
};

// Row sources: row b of a row-major [*, K] buffer, or nullptr past `count`.
struct DenseRows {
  const bf16* base;
  int ld, count;
  __device__ const bf16* row(int b) const { return b < count ? base + (long long)b * ld : nullptr; }
};
struct GatheredRows {  // row b -> base[index[b] / div]
  const bf16* base;
  int ld, count;
  const int* index;
  int div;
  __device__ const bf16* row(int b) const { return b < count ? base + (long long)(index[b] / div) * ld : nullptr; }
};

// Partial sums of one stage: part[(warp * R + row) * bp + b] for the stage's RS rows (task rows
// row_base..), batch rows b = b0 + g (+8).
template <int K, int RS, int MH, int W = kConsumerWarps>
__device__ __forceinline__ void mma_stage(const uint8_t* stage, const ActTile<K, MH, W>& a, float* part, int R, int bp,
                                          int row_base, int b0, int warp, int lane) {
  constexpr int KCH = ActTile<K, MH, W>::KCH;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < (RS + 7) / 8; ++nt) {
    // Stages of 4 rows fill half an 8-row tile: lanes of rows past the stage read its last row, and their
    // outputs are dropped below.
    const int row = min(nt * 8 + g, RS - 1);
    const uint4* w = reinterpret_cast<const uint4*>(stage + (long long)row * K * 2) + warp * KCH * 4 + t;
    float acc[2][4] = {};
#pragma unroll
    for (int c = 0; c < KCH; ++c) {
      const uint4 wv = w[c * 4];
      const uint32_t hi0 = MH > 1 ? a.v[MH - 1][c].x : 0u, hi1 = MH > 1 ? a.v[MH - 1][c].y : 0u;
      const uint32_t hi2 = MH > 1 ? a.v[MH - 1][c].z : 0u, hi3 = MH > 1 ? a.v[MH - 1][c].w : 0u;
      mma_16816(acc[c & 1], a.v[0][c].x, hi0, a.v[0][c].y, hi1, wv.x, wv.y);
      mma_16816(acc[c & 1], a.v[0][c].z, hi2, a.v[0][c].w, hi3, wv.z, wv.w);
    }
    const int r = nt * 8 + 2 * t;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (r + j >= RS) continue;
      float* out = part + ((long long)warp * R + row_base + r + j) * bp + b0 + g;
      out[0] = acc[0][j] + acc[1][j];
      if (MH > 1) out[8] = acc[0][2 + j] + acc[1][2 + j];
    }
  }
}

// Sums over the consumer warps, in place: part[(w * R + r) * bp + b] -> part[r * bp + b] (fixed order).
__device__ __forceinline__ void reduce_warps(float* part, int n) {
  for (int i = Role::consumer_thread(); i < n; i += kConsumerThreads) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kConsumerWarps; ++w) s += part[(long long)w * n + i];
    part[i] = s;
  }
}

// The task's stages against activation rows held in registers; the sums end in part[r * bp + b].
template <int K, int RS, int MH>
__device__ bool gemm_stages(Consumer& c, const ActTile<K, MH>& a, int nstages, float* part, int R, int bp) {
  c.mark_inputs();
  for (int s = 0; s < nstages; ++s) {
    const uint8_t* stage = c.stages.wait();
    if (!stage) return false;
    mma_stage<K, RS, MH>(stage, a, part, R, bp, s * RS, 0, c.warp, c.lane);
    c.stages.release();
  }
  c.mark_stages();
  consumer_sync();
  reduce_warps(part, R * bp);
  consumer_sync();
  return true;
}

// More than 16 rows: the activation rows do not fit registers, so each 16-row group's slice is reloaded
// from L2 and run against several stages held at once (G of them, as many as the ring and the partial
// buffer allow): one reload per G stages instead of one per stage, since at 32-64 rows a stage's 32 KB of
// weights met 128-256 KB of activation reloads and the task ran at L2's pace, not HBM's (PERF_LOG #60).
// The held stages' per-warp partial sums (part + R * bp, [warp][G * RS][bp]) are added into the task's
// sums (part, [R][bp]) in the fixed warp order before the next G stages: the same additions in the same
// order as one stage at a time, so the sums do not depend on G.
__host__ __device__ constexpr int grouped_held_stages(int R, int RS, int bp, int nstages) {
  const int fit = (abi::kPartialFloats - R * bp) / (kConsumerWarps * RS * bp);
  const int g = fit < kStages ? fit : kStages;
  return g < nstages ? g : nstages;
}

template <int K, int RS, class Src>
__device__ bool gemm_stages_grouped(Consumer& c, const Src& src, int count, int nstages, float* part, int R, int bp) {
  const int held = grouped_held_stages(R, RS, bp, nstages);  // >= 1: layout.partial_cap sizes R for one
  float* stage_part = part + R * bp;
  c.mark_inputs();
  for (int s = 0; s < nstages; s += held) {
    const int g = min(held, nstages - s), rows = g * RS;
    const uint8_t* stage[kStages];
#pragma unroll
    for (int i = 0; i < kStages; ++i) {
      if (i >= g) break;
      stage[i] = c.stages.wait_ahead(i);
      if (!stage[i]) return false;
    }
    for (int b0 = 0; b0 < count; b0 += 16) {
      ActTile<K, 2> a;
      a.load(src, b0, c.warp, c.lane);
#pragma unroll
      for (int i = 0; i < kStages; ++i) {
        if (i >= g) break;
        mma_stage<K, RS, 2>(stage[i], a, stage_part, rows, bp, i * RS, b0, c.warp, c.lane);
      }
    }
    for (int i = 0; i < g; ++i) c.stages.release();
    consumer_sync();
    for (int i = c.thread; i < rows * bp; i += kConsumerThreads) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kConsumerWarps; ++w) v += stage_part[w * rows * bp + i];
      part[s * RS * bp + i] = v;
    }
    consumer_sync();
  }
  c.mark_stages();
  return true;
}

// A whole GEMM task over `count` rows from `src`: R weight rows in R / RS stages. Leaves the sums in
// part[r * bp + b] (bp = padded_rows(count)), visible to every consumer thread; false on abort.
template <int K, int RS, class Src>
__device__ bool gemm_task(Consumer& c, const Src& src, int count, int R, float* part) {
  const int bp = padded_rows(count), nstages = R / RS;
  if (count <= 8) {
    ActTile<K, 1> a;
    a.load(src, 0, c.warp, c.lane);
    return gemm_stages<K, RS, 1>(c, a, nstages, part, R, bp);
  }
  if (count <= kMaxRegisterRows) {
    ActTile<K, 2> a;
    a.load(src, 0, c.warp, c.lane);
    return gemm_stages<K, RS, 2>(c, a, nstages, part, R, bp);
  }
  return gemm_stages_grouped<K, RS>(c, src, count, nstages, part, R, bp);
}

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }

// Epilogues, after gemm_task left the sums in part[r * bp + b]. ``row(b)`` is where batch row b's outputs
// start in the destination (the task's first output column already added).

// Weight row r of the task -> output column r, rounded to bf16, two columns a store (R is even: a task is whole
// stages, and layout.rows_per_stage gives these GEMMs 4 or 16 rows a stage).
template <int RS, class Row>
__device__ __forceinline__ void store_rows(const Consumer& c, const float* part, int R, int count, int bp, Row row) {
  // R and the task's first column are whole stages of RS rows (a cut last down tile ends at hidden, also even):
  // every pair is 4-byte aligned and none is half outside the task
  static_assert(RS % 2 == 0 && abi::kHidden % 2 == 0, "store_rows stores two columns a store");
  const int pairs = R / 2;
  for (int idx = c.thread; idx < pairs * count; idx += kConsumerThreads) {
    const int r = 2 * (idx % pairs), b = idx / pairs;
    const uint32_t pair = pack2(part[r * bp + b], part[(r + 1) * bp + b]);
    *reinterpret_cast<uint32_t*>(row(b) + r) = pair;
  }
}

// An up/gate task's sums (cols gate rows, then cols up rows) -> silu(gate) * up on the bf16-rounded sums, in
// fp32, rounded once (vLLM's SiluAndMul).
template <class Row>
__device__ __forceinline__ void store_silu_mul(const Consumer& c, const float* part, int cols, int count, int bp,
                                               Row row) {
  for (int idx = c.thread; idx < cols * count; idx += kConsumerThreads) {
    const int j = idx % cols, b = idx / cols;
    const float gate = round_bf16(part[j * bp + b]);
    const float up = round_bf16(part[(cols + j) * bp + b]);
    row(b)[j] = __float2bfloat16(silu(gate) * up);
  }
}

}  // namespace vllm_megakernel

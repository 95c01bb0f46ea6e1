// Flagged residual words (abi.RESIDUAL_WORDS; schedule.StepShape's flagged_residual): the layer boundary's
// hand-over without a fence or a barrier. The writers of x, o and mlp (QKV's write_x task, O_PROJ, MOE_COMBINE,
// DENSE_DOWN) store each pair of bf16 columns, beside the plain buffer's copy, as one 64-bit word that also holds
// the writing layer + 1, with relaxed stores and nothing after them; the next layer's folded-norm tasks (QKV_ROPE,
// ROUTER with their `flagged` field) copy the words from the start of the task until every one carries their
// previous layer's flag (poll_row8, from the consumer loop, megakernel.cu), instead of waiting on that layer's
// barriers first (NCCL's LL protocol). The words sit in the step's barrier array, which the host zeroes before
// every launch; x, o and mlp alternate between two buffers by layer parity, so a word holds one of the layers l,
// l + 2, ..., and the flag tells them apart.
//
// What makes a word whole: each is one naturally aligned 64-bit store (a 16-byte store of two is one access per
// element), and the PTX memory model makes such a store single-copy atomic against a morally strong read; the
// reader's cp.async copies are weak reads, assumed whole because an aligned 8-byte word is one access at L2 (a
// hardware assumption, not the model's guarantee; NCCL's LL protocol relies on the same for its 16-byte volatile
// accesses). tests/gpu/test_megakernel_step.py checks the step bit for bit against the plain one.
//
// What the flag does not order: the reader's own writes. They wait for the same barriers as ever
// (Consumer::wait_inputs), because the buffers it overwrites were read by tasks those barriers wait for.
#pragma once

#include "barrier.cuh"
#include "common.cuh"
#include "roles.cuh"

namespace vllm_megakernel::flagged {

using Word = unsigned long long;

__device__ __forceinline__ Word word(uint32_t pair, int layer) {
  return (Word)pair | (Word)(uint32_t)(layer + 1) << abi::kResidualFlagShift;
}
__device__ __forceinline__ uint32_t flag_of(Word w) { return (uint32_t)(w >> abi::kResidualFlagShift); }

// Two words in one 16-byte store (each element is its own single-copy-atomic access).
__device__ __forceinline__ void store2(Word* p, Word a, Word b) {
  asm volatile("st.relaxed.gpu.global.v2.b64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

// Eight bf16 columns [col, col + 8) of a row, `v` as the plain buffer holds them, as the row's four words.
__device__ __forceinline__ void store8(Word* row, int col, const uint4& v, int layer) {
  Word* p = row + col / 2;
  store2(p, word(v.x, layer), word(v.y, layer));
  store2(p + 2, word(v.z, layer), word(v.w, layer));
}

// A word pair for columns [col, col + 2) of a row.
__device__ __forceinline__ void store_pair(Word* row, int col, uint32_t pair, int layer) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(row + col / 2), "l"(word(pair, layer)) : "memory");
}

// One batch row's x_l = (x + o) + mlp of the previous layer for a consumer thread's eight columns [col, col + 8),
// from its flagged words: the thread's twelve words (two 16-byte pieces of each of x, o and mlp) are copied into
// `stage` (its own 96 bytes at stage + col / 8 * 12 words) with cp.async, and the pieces whose words do not all
// carry the previous layer's flag copied again, until all do. Copies, not loads: the pieces in flight hold no
// registers (loads into registers here, in the consumer loop, made ptxas spill ~3 KB across its GEMM paths). The
// copies are weak reads polling relaxed stores: each aligned 8-byte word is one access at L2, so a copy sees it
// whole (NCCL's LL protocol polls its 16-byte lines the same way); a word with the flag holds its pair. Bounded
// like every wait (barrier.cuh's poll_bounded): false on a timeout (recorded with abi::kFlaggedResidualWait:
// expected the flag polled for, seen the flag of a word that lacked it) or another SM's abort.
__device__ __forceinline__ bool poll_row8(const Step& st, int layer, int row, int col, Word* stage, uint4& x,
                                          const int* desc, int* error, long long timeout_ns) {
  constexpr int NB = abi::kResidualBuffers, kRow = abi::kHidden / 2;
  Word* mine = stage + col / 8 * (NB * 4);
  const auto copy = [&](int buf, int h) {
    const Word* src = st.residual_words(buf, layer - 1) + (long long)row * kRow + col / 2 + 2 * h;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(mine + buf * 4 + 2 * h)),
                 "l"(src)
                 : "memory");
  };
#pragma unroll
  for (int buf = 0; buf < NB; ++buf)
#pragma unroll
    for (int h = 0; h < 2; ++h) copy(buf, h);
  const uint32_t want = (uint32_t)layer;  // written by layer - 1
  uint32_t seen = want;
  const bool ok = poll_bounded(
      [&] {
        asm volatile("cp.async.wait_all;" ::: "memory");
        bool all = true;
#pragma unroll
        for (int buf = 0; buf < NB; ++buf)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const Word a = mine[buf * 4 + 2 * h], b = mine[buf * 4 + 2 * h + 1];
            if (flag_of(a) == want && flag_of(b) == want) continue;
            seen = flag_of(a) != want ? flag_of(a) : flag_of(b);
            all = false;
            copy(buf, h);
          }
        return all;
      },
      [&] { report_stall(error, desc, abi::kFlaggedResidualWait, (int)want, (int)seen); }, error, timeout_ns);
  if (!ok) {
    asm volatile("cp.async.wait_all;" ::: "memory");  // none may land after the caller reuses the stage
    return false;
  }
  uint4 v[NB];
#pragma unroll
  for (int buf = 0; buf < NB; ++buf) {
    const Word* w = mine + buf * 4;
    v[buf] = make_uint4((uint32_t)w[0], (uint32_t)w[1], (uint32_t)w[2], (uint32_t)w[3]);
  }
  x = residual_add8(v[abi::kResidualX], v[abi::kResidualO], v[abi::kResidualMlp]);
  return true;
}

// Shared memory the flagged folded norm uses, at the start of the task's partial sums (free until its first
// stage): one row's words (kHidden / 2 x kResidualBuffers, every consumer thread's twelve), then x_l of the batch's
// rows (bf16). Up to kFlaggedResidualMaxBatch rows; the rows are polled one at a time.
constexpr int kStageWords = abi::kHidden / 2 * abi::kResidualBuffers;
__host__ __device__ constexpr int scratch_bytes(int rows) { return kStageWords * 8 + rows * abi::kHidden * 2; }
// x_l's rows in that scratch (bf16, row b at + b * kHidden), after the stage.
__device__ __forceinline__ bf16* x_rows(void* scratch) {
  return reinterpret_cast<bf16*>(static_cast<Word*>(scratch) + kStageWords);
}

}  // namespace vllm_megakernel::flagged

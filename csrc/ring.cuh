// The descriptor ring between a block's controller warp and its workers.
//
// kRingSlots slots, each guarded by two hardware arrive/wait barriers (mbarriers) in shared memory:
//   full[s]  completes a phase when all 32 controller lanes have stored their word of a descriptor
//            (arrive count 32; an arrive releases the lane's store to whoever acquires the phase);
//   empty[s] completes a phase when all 32 lanes of the first worker warp have copied it out
//            (arrive count 32), so the controller may overwrite the slot.
// Task i lives in slot i % kRingSlots during phase i / kRingSlots of both barriers, so its waits name the
// parity (i / kRingSlots) & 1; a slot is never refilled before its previous phase was consumed, so a
// parity is never ambiguous. Hardware barriers rather than flag words: the ordering comes from the
// barrier's release/acquire, and compute-sanitizer's racecheck sees it too.
#pragma once

#include "common.cuh"

namespace vllm_megakernel {

static_assert(abi::kTaskWords == 32, "the ring moves a descriptor as one word per lane of a warp");

struct DescriptorRing {
  int words[kRingSlots][abi::kTaskWords];
  unsigned long long full[kRingSlots];
  unsigned long long empty[kRingSlots];

  static __device__ __forceinline__ int slot(int task) { return task % kRingSlots; }
  static __device__ __forceinline__ int parity(int task) { return (task / kRingSlots) & 1; }

  // One thread, before the block-wide barrier that precedes any use.
  __device__ void init() {
    for (int s = 0; s < kRingSlots; ++s) {
      init_one(&full[s], 32);
      init_one(&empty[s], 32);
    }
  }

  static __device__ __forceinline__ unsigned addr(const unsigned long long* bar) {
    return static_cast<unsigned>(__cvta_generic_to_shared(bar));
  }
  static __device__ __forceinline__ void init_one(unsigned long long* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(addr(bar)), "r"(count) : "memory");
  }
  static __device__ __forceinline__ void arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(addr(bar)) : "memory");
  }
  // True once the phase of the given parity has completed (acquire); false after a bounded hardware wait.
  static __device__ __forceinline__ bool test(unsigned long long* bar, int parity) {
    unsigned done;
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(addr(bar)), "r"(parity)
        : "memory");
    return done != 0;
  }
};

}  // namespace vllm_megakernel

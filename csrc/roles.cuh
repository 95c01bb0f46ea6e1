// Warp roles of the block, the one place they are computed from threadIdx.
//
// Warps 0..kConsumerWarps-1 (two warpgroups) are the consumers: they wait on the task's input barriers, stage
// its activations, run its math on the staged tiles and hand the finished task to the signaller. Warp
// kProducerWarp is the producer: it fetches this SM's descriptors from global memory into the descriptor
// ring and issues every task's weight and K/V loads (bulk copies into the stage ring) as far ahead of the
// consumers as the rings allow, before the task's inputs are ready (weights never depend on activations).
// Warp kSignallerWarp is the signaller: lane 0 makes each finished task's writes visible device-wide and
// signals its barrier, in task order, so the consumers go on to the next task instead of waiting for the
// fence's round trip to L2. Warp kLookaheadWarp: lane 0 checks each task's input barriers ahead of the
// consumer leader (megakernel.cu, run_lookahead). The producer, the signaller, the look-ahead warp and a spare
// warp make the third warpgroup, which
// gives registers to the consumers (setmaxnreg). Consumers synchronise among themselves on a named barrier
// that leaves the third warpgroup out.
#pragma once

#include "abi.h"

namespace vllm_megakernel {

constexpr int kConsumerWarps = abi::kConsumerWarps;
constexpr int kConsumerThreads = kConsumerWarps * 32;
static_assert(kConsumerWarps == 8, "the consumers are two whole warpgroups");
// Consumers: warpgroups 0-1 (warps 0-7). Warpgroup 2: the producer (warp 8), the signaller (warp 9), the
// look-ahead (warp 10) and a spare warp that only hands its registers back. Whole warpgroups, so that each side can set its register
// budget (setmaxnreg acts on a warpgroup): with 10 warps an SM sub-partition held three of them and the
// kernel was capped at 168 registers a thread, the consumers' GEMM paths spilling at that cap.
constexpr int kThreads = kConsumerThreads + 128;
constexpr int kProducerWarp = kConsumerWarps, kSignallerWarp = kConsumerWarps + 1, kLookaheadWarp = kConsumerWarps + 2;
// setmaxnreg moves registers within the block's own pool, kThreads x the count ptxas compiled the kernel for
// (168 at kThreads = 384: 65536 / 384, rounded down to a multiple of 8); an increase that the pool cannot
// cover blocks forever. So the two budgets spend exactly that pool (launch_decode checks the compiled count).
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
constexpr int kConsumerRegisters = 216, kSupportRegisters = 72;
static_assert(kConsumerThreads * kConsumerRegisters + (kThreads - kConsumerThreads) * kSupportRegisters <=
                  kThreads * kLaunchRegisters,
              "the raised and lowered budgets must fit the block's register pool");

struct Role {
  static __device__ __forceinline__ int warp() { return (int)(threadIdx.x >> 5); }
  static __device__ __forceinline__ bool consumer() { return threadIdx.x < kConsumerThreads; }
  static __device__ __forceinline__ bool producer() { return warp() == kProducerWarp; }
  static __device__ __forceinline__ bool signaller() { return warp() == kSignallerWarp; }
  static __device__ __forceinline__ bool lookahead() { return warp() == kLookaheadWarp; }
  static __device__ __forceinline__ int lane() { return threadIdx.x & 31; }
  // Consumer warp 0..kConsumerWarps-1 and consumer thread 0..kConsumerThreads-1 (consumers only).
  static __device__ __forceinline__ int consumer_warp() { return warp(); }
  static __device__ __forceinline__ int consumer_thread() { return (int)threadIdx.x; }
  // The consumer thread that waits on a task's input barriers and signals its output barrier.
  static __device__ __forceinline__ bool consumer_leader() { return threadIdx.x == 0; }
};

// A warpgroup's register budget (PTX setmaxnreg; no CCCL wrapper covers it): every warp of the warpgroup
// executes the same one.
template <int kRegisters>
__device__ __forceinline__ void raise_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void lower_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// Every consumer thread, never the producer (which runs ahead on its own) or the signaller.
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"r"(kConsumerThreads) : "memory");
}

}  // namespace vllm_megakernel

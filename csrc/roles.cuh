// Warp roles of the block, the one place they are computed from threadIdx.
//
// Warp 0 is the producer: it fetches this SM's descriptors from global memory into the descriptor ring and
// issues every task's weight and K/V loads (bulk copies into the stage ring) as far ahead of the consumers
// as the rings allow, before the task's inputs are ready (weights never depend on activations). Warps
// 1..kConsumerWarps are the consumers: they wait on the task's input barriers, stage its activations, run
// its math on the staged tiles and hand the finished task to the signaller. The last warp is the
// signaller: lane 0 makes each finished task's writes visible device-wide and signals its barrier, in task
// order, so the consumers go on to the next task instead of waiting for the fence's round trip to L2.
// Consumers synchronise among themselves on a named barrier that leaves the other two warps out.
#pragma once

#include "abi.h"

namespace vllm_megakernel {

constexpr int kConsumerWarps = abi::kConsumerWarps;
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kThreads = kConsumerThreads + 64;

struct Role {
  static __device__ __forceinline__ bool producer() { return threadIdx.x < 32; }
  static __device__ __forceinline__ bool signaller() { return threadIdx.x >= 32 + kConsumerThreads; }
  static __device__ __forceinline__ int lane() { return threadIdx.x & 31; }
  // Consumer warp 0..kConsumerWarps-1 and consumer thread 0..kConsumerThreads-1 (consumers only).
  static __device__ __forceinline__ int consumer_warp() { return (int)(threadIdx.x >> 5) - 1; }
  static __device__ __forceinline__ int consumer_thread() { return (int)threadIdx.x - 32; }
  // The consumer thread that waits on a task's input barriers and signals its output barrier.
  static __device__ __forceinline__ bool consumer_leader() { return threadIdx.x == 32; }
};

// Every consumer thread, never the producer (which runs ahead on its own) or the signaller.
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"r"(kConsumerThreads) : "memory");
}

}  // namespace vllm_megakernel

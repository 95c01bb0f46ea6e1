// Dependency counters between tasks on different SMs.
//
// Protocol (one per dependency edge, O(1) fan-in and fan-out): a finishing task makes its writes visible
// device-wide and then adds one to its signal counter with release semantics; a starting task spins on an
// acquire load until the counter reaches the number of tasks that signal it (computed by the host
// schedule). Counters are zeroed by the host before every step (inside the captured graph).
//
// Every wait is bounded: past the timeout the waiter records which task, SM, opcode, layer and barrier
// stalled and what it saw, raises the abort flag (error word 0) and the whole grid unwinds. A wrong count
// therefore fails loudly and names itself instead of hanging the GPU.
#pragma once

#include <cuda/atomic>

#include "common.cuh"

namespace vllm_megakernel {

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ bool aborted(const int* error) {
  return cuda::atomic_ref<const int, cuda::thread_scope_device>(*error).load(cuda::memory_order_relaxed) != 0;
}

// This thread's earlier writes are visible device-wide before its later ones (the release half of the
// barrier protocol; fence.sc, what __threadfence() emits, is stronger than the protocol needs).
__device__ __forceinline__ void release_fence() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// Records which task, SM, opcode, layer and wait stalled and what it saw, and raises the abort flag (error
// word 0); the first reporter wins, and its record is complete before the flag is published.
__device__ inline void report_stall(int* error, const int* desc, int barrier, int expected, int seen) {
  if (atomicCAS(&error[abi::E_SM], -1, (int)blockIdx.x) == -1) {
    error[abi::E_TASK_INDEX] = desc[abi::F_TASK_INDEX];
    error[abi::E_OPCODE] = desc[abi::F_OPCODE];
    error[abi::E_LAYER] = desc[abi::F_LAYER];
    error[abi::E_BARRIER] = barrier;
    error[abi::E_EXPECTED] = expected;
    error[abi::E_SEEN] = seen;
    __threadfence();
    atomicExch(&error[abi::E_FLAG], 1);
  }
}

// How a bounded wait's pollers agree to give up: each thread on its own (every wait of one thread), or the whole
// warp on lane 0's reading of the error word and the clock (a warp that polls together, its `done()` a warp-wide
// vote: its lanes must leave the loop on the same poll).
struct EachThread {
  __device__ bool operator()(bool verdict) const { return verdict; }
};
struct WholeWarp {
  __device__ bool operator()(bool verdict) const { return __shfl_sync(0xffffffffu, verdict, 0); }
};

// Every bounded wait: polls `done()` at once, then every ~20 ns, until it returns true. Each poll is one round trip
// to L2. The error word (another SM's abort) and the clock (this wait's own timeout) are read on every 16th poll
// only: read on every poll, the error word was a second round trip in series with the counter's, which every wait
// on a layer's critical path paid. Past the timeout `stalled()` records the wait; false when the step was aborted
// (by this wait or another SM's). `agree` says whose reading of those two decides (EachThread, WholeWarp).
template <class Done, class Stalled, class Agree = EachThread>
__device__ __forceinline__ bool poll_bounded(Done done, Stalled stalled, const int* error, long long timeout_ns,
                                             Agree agree = {}) {
  if (done()) return true;
  const unsigned long long start = global_timer_ns();
  for (unsigned polls = 1;; ++polls) {
    __nanosleep(20);
    if (done()) return true;
    if (polls % 16) continue;
    if (agree(aborted(error))) return false;
    if (agree((long long)(global_timer_ns() - start) > timeout_ns)) {
      stalled();
      return false;
    }
  }
}

// Called by ONE thread. Returns false when the step was aborted (by this wait or another SM's). Every poll is
// an acquire load (ld.acquire.gpu: the load, then an L1 invalidation), and the one that sees the count
// synchronizes with every signaller: the count is the last write of a release sequence of relaxed reductions,
// each after its signaller's release fence. No fence here: an acquire fence after a relaxed poll compiles to
// MEMBAR.ALL.GPU, which waits for every request this SM has in flight, the producer's bulk copies of the task's
// own weights included (fence probe, PERF_LOG #139: 2-8 us with a full ring), so a check whose inputs were
// long done cost 1-2 us. Polling with acquire loads was 4.9 / 3.6 / 2.4% faster at batch 1 / 2 / 8 (#143).
__device__ inline bool wait_barrier(int* barriers, int barrier, int count, int* error, long long timeout_ns,
                                    const int* desc) {
  if (barrier == abi::kNoBarrier) return true;
  cuda::atomic_ref<int, cuda::thread_scope_device> ctr(barriers[barrier]);
  int seen = 0;
  return poll_bounded([&] { return (seen = ctr.load(cuda::memory_order_acquire)) >= count; },
                      [&] { report_stall(error, desc, barrier, count, seen); }, error, timeout_ns);
}

// Called by ONE thread (the signaller) after its release_fence(), which follows every writer's writes through
// the consumers' named barrier and the hand-over mbarrier. A reduction without a return value: the
// signalling thread does not wait for the count to come back. Relaxed: the fence before it makes the pair
// a release pattern (PTX memory model: a fence.acq_rel followed by a strong write), and a red.release
// would put a second MEMBAR.GPU between the fence and the signal (the SASS of red.release).
__device__ __forceinline__ void arrive_barrier(int* barriers, int barrier, int n = 1) {
  if (barrier == abi::kNoBarrier) return;
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;" ::"l"(barriers + barrier), "r"(n) : "memory");
}

}  // namespace vllm_megakernel

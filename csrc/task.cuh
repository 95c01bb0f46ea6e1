// What an op body sees: its descriptor, its layer, the step, and the role-side of the pipeline it runs on.
//
// The op contract (ops/*.cuh): every opcode is a struct with
//   - `struct Shared`: its typed shared-memory scratch (the kernel overlays them in one union);
//   - `static bool load(Producer&, const Task&)`: runs on lane 0 of the producer warp, possibly long before
//     the task's inputs are ready; issues the task's weight / K/V loads as stages of the ring. It may wait
//     only on the descriptor's load_wait barrier (data this step writes that decides what to load);
//   - `static bool compute(Consumer&, const Task&, Shared&)`: runs on every consumer thread after the
//     task's input barriers are satisfied; consumes exactly the stages `load` issued, in order, and writes
//     the task's outputs. The loop (megakernel.cu) owns the waits, the fences and the signal.
//   - optionally `static bool has_work(const Step&, const Task&)`, declared exactly by the opcodes in
//     abi::waits_only_if_work (checked at compile time): false when the task has nothing to do on this
//     step's live data, decided only from what the host wrote before the launch (sequence lengths). Such a
//     task reads and writes nothing, so the loop skips its input waits; it still signals.
// Both return false only when the block aborted (a wait gave up); the loop then unwinds.
#pragma once

#include <type_traits>
#include <utility>

#include "barrier.cuh"
#include "common.cuh"
#include "pipeline.cuh"
#include "roles.cuh"

namespace vllm_megakernel {

struct Task {
  const int* d;  // the descriptor's words, in the descriptor ring
  Layer ly;
  __device__ int operator[](int field) const { return d[field]; }
  __device__ int layer() const { return d[abi::F_LAYER]; }
};

struct Producer {
  Step st;
  StageProducer stages;
  int* barriers;
  int* error;
  long long timeout_ns;

  // Waits (bounded) on the task's load_wait barrier; false if the step is being aborted.
  __device__ bool load_wait(const Task& t) {
    const bool ok = wait_barrier(barriers, t[abi::F_LOAD_WAIT_BARRIER], t[abi::F_LOAD_WAIT_COUNT], error, timeout_ns,
                                 t.d);
    if (!ok) stages.p.abort = 1;
    // This step's data written by other SMs with ordinary stores, about to be read by bulk copies (the
    // async proxy): order the acquire above before them.
    ptx::fence_proxy_async(ptx::space_global);
    return ok;
  }
};

// Barriers the consumer leader has seen complete this step (a barrier never goes back below its target
// within a step): a later wait on one of them costs no round trip to L2.
constexpr int kKnownBarriers = 16384;

// Whether `barrier` is complete: true at once if the bitmap `complete` (one bit a barrier below kKnownBarriers)
// already says so, else what `reached()` finds, remembered in the bitmap when it is true. Each bitmap has one
// owner thread: the consumer leader's (BlockContext::complete) and the look-ahead lane's (megakernel.cu).
template <class Reached>
__device__ __forceinline__ bool known_or_reached(uint32_t* complete, int barrier, Reached reached) {
  const bool cacheable = barrier >= 0 && barrier < kKnownBarriers;
  if (cacheable && (complete[barrier >> 5] >> (barrier & 31) & 1u)) return true;
  if (!reached()) return false;
  if (cacheable) complete[barrier >> 5] |= 1u << (barrier & 31);
  return true;
}

// The consumer leader's wait on one of a task's input barriers; `complete` is its bitmap of known barriers.
__device__ __forceinline__ bool wait_input(uint32_t* complete, int* barriers, int barrier, int count, int* error,
                                           long long timeout_ns, const int* desc) {
  return known_or_reached(complete, barrier,
                          [&] { return wait_barrier(barriers, barrier, count, error, timeout_ns, desc); });
}

// The consumer leader's waits on a task's two input barriers, in the descriptor's order.
__device__ __forceinline__ bool wait_task_inputs(uint32_t* complete, int* barriers, int* error, long long timeout_ns,
                                                 const int* desc) {
  return wait_input(complete, barriers, desc[abi::F_WAIT0_BARRIER], desc[abi::F_WAIT0_COUNT], error, timeout_ns, desc) &&
         wait_input(complete, barriers, desc[abi::F_WAIT1_BARRIER], desc[abi::F_WAIT1_COUNT], error, timeout_ns, desc);
}

// What the consumer loop's waits and aborts need beyond the step table (megakernel.cu). It sits in shared memory
// right after the step table, so a consumer reaches it through its Step (Consumer::ctx) and no register holds it
// across the consumer loop, whose GEMM paths use every register the consumers have.
struct BlockContext {
  volatile int* pipe_abort;  // the producer's and the signaller's ring waits see it
  int* error;                // the step's stall record (barrier.cuh), for an op body's own bounded polls
  int consumer_abort;        // written before a consumer_sync, read by every consumer after it
  uint32_t complete[kKnownBarriers / 32];  // the consumer leader's alone
  // The consumer leader's trace stamps of its current task (traced launches only). In shared memory, not in
  // registers: held across the task's body they spilled (24 B, STL on every task's path).
  unsigned long long wait_start_ns, run_start_ns;
};

struct Consumer {
  Step st;
  StageConsumer stages;
  int warp;    // consumer warp, 0..kConsumerWarps-1
  int lane;
  int thread;  // consumer thread, 0..kConsumerThreads-1
  bool tracing;
  unsigned long long inputs_ns = 0, stages_ns = 0;  // the leader's phase marks for the trace

  __device__ BlockContext& ctx() const {
    return *reinterpret_cast<BlockContext*>(const_cast<long long*>(st.w) + abi::kStepWords);
  }
  // Any consumer thread that gave up (a wait timed out or saw another SM's abort): the consumers learn of it
  // after their next consumer_sync, the producer and the signaller in their ring waits.
  __device__ void abort() const {
    BlockContext& x = ctx();
    x.consumer_abort = 1;
    *x.pipe_abort = 1;
  }
  // Phase marks of the task being traced (taken by the consumer leader only).
  __device__ void mark_inputs() {
    if (tracing && Role::consumer_leader()) inputs_ns = global_timer_ns();
  }
  __device__ void mark_stages() {
    if (tracing && Role::consumer_leader()) stages_ns = global_timer_ns();
  }
};

// Whether an op struct declares the optional has_work hook.
template <class T, class = void>
struct DeclaresHasWork : std::false_type {};
template <class T>
struct DeclaresHasWork<T, decltype(void(T::has_work(std::declval<const Step&>(), std::declval<const Task&>())))>
    : std::true_type {};

template <class T>
__device__ __forceinline__ bool op_has_work(const Step& st, const Task& t) {
  if constexpr (DeclaresHasWork<T>::value)
    return T::has_work(st, t);
  else
    return true;
}

}  // namespace vllm_megakernel

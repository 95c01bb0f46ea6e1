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

struct Consumer {
  Step st;
  StageConsumer stages;
  int warp;    // consumer warp, 0..kConsumerWarps-1
  int lane;
  int thread;  // consumer thread, 0..kConsumerThreads-1
  bool tracing;
  unsigned long long inputs_ns = 0, stages_ns = 0;  // the leader's phase marks for the trace

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

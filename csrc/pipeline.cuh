// The two rings between the producer warp and the consumer warps of a block, on hardware mbarriers.
//
// Descriptor ring (kDescSlots): task i lives in slot i % kDescSlots. desc_full[s] completes a phase when
// the 32 producer lanes have stored their word of the descriptor (count 32); done[s] when the consumers
// have finished the task (count 1: the consumer leader, after a named barrier of all consumers that
// follows their writes); inputs_seen[s] when the look-ahead lane has seen the task's input barriers complete
// (count 1; it also arrives when the consumers finished the task first, or when the task reads nothing: the
// leader tests it only before its own wait, so a late arrival tells no one anything; the look-ahead lane then
// waits on the phase it completed, so that every phase has a waiter, as synccheck requires); desc_empty[s] when every
// consumer lane, the signaller and the look-ahead lane are done with the task, descriptor words included (count
// kConsumerWarps x 32 + 2: each lane's own arrival, a release at CTA scope, orders its own reads of the words
// before the producer's rewrite; an arrival by lane 0 after __syncwarp() leaves lanes 1-31's reads unordered
// for compute-sanitizer 2026.4's racecheck, as CUTLASS's pipelines count every consumer thread). Neither the
// signaller nor the look-ahead can be lapped: slot s is refilled only after their arrivals on desc_empty[s],
// and the look-ahead arrives on inputs_seen[s] first, so the leader's test of task i's phase never sees the
// phase of task i - kDescSlots still open (which its parity would read as complete).
//
// Stage ring (kStages buffers of kStageBytes): the producer's n-th stage lives in buffer n % kStages.
// full[s] completes when the producer's arrive (count 1, with the stage's byte count as expected
// transaction bytes) and every bulk copy into the buffer have landed; empty[s] when every consumer lane
// has released it (count kConsumerWarps x 32: each lane's own proxy fence and arrival order its own reads
// before the refill, see StageConsumer::release). Every consumer warp walks every stage of every task in order,
// also the stages it does not read, so that the arrival counts hold; both sides derive a task's stage
// count from the same descriptor and device data.
//
// Phases: the n-th use of a buffer (n = count / ring size) is waited on with parity n & 1 by the side
// that consumes it, and with parity (n & 1) ^ 1 by the side that refills it (a fresh barrier counts its
// phase -1 as complete, so the first use of every buffer passes). Under a cap on stages in flight the
// producer also waits on full[] of the stage `in_flight` back, with that stage's own parity, before it claims
// the next buffer (StageProducer below). Every wait checks the block's abort flag while it spins, and only
// while the barrier is not yet complete.
//
// Aborts and the consumer warps: the consumers meet at named barriers, so after an abort they must all
// give up at the same ring position; if one warp gave up on a stage or descriptor still being filled while
// another saw it land, the second would wait at the next named barrier for the first forever. So a
// consumer's ring wait that sees the abort flag does not decide alone: it waits for the producer to leave
// (it does, within its own bounded waits, once the flag is up) and to publish how many stages and
// descriptors it filled, then gives up only on a position past those and waits out one before them
// (filled: its copies and stores land). Every warp then gives up at the first unfilled position. The
// producer publishes once, as it leaves: nothing on the per-stage path.
#pragma once

#include <cuda/ptx>

#include "common.cuh"
#include "roles.cuh"

namespace vllm_megakernel {

namespace ptx = cuda::ptx;

constexpr int kStages = abi::kStages;
constexpr int kStageBytes = abi::kStageBytes;
constexpr int kDescSlots = abi::kDescSlots;

struct PipelineStorage {
  alignas(128) uint8_t stage[kStages][kStageBytes];
  uint64_t full[kStages];
  uint64_t empty[kStages];
  int desc[kDescSlots][abi::kTaskWords];
  uint64_t desc_full[kDescSlots];
  uint64_t done[kDescSlots];
  uint64_t inputs_seen[kDescSlots];
  uint64_t desc_empty[kDescSlots];
  volatile int abort;  // raised by whichever role gave up; every ring wait checks it
  // Published by the producer as it leaves (producer_left set last, with release order): the stages and
  // descriptors it filled this step.
  uint32_t filled_stages, filled_descs;
  int producer_left;

  // One thread, before the block-wide barrier that precedes any use.
  __device__ void init() {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], kConsumerWarps * 32);
    }
    for (int s = 0; s < kDescSlots; ++s) {
      ptx::mbarrier_init(&desc_full[s], 32);
      ptx::mbarrier_init(&done[s], 1);
      ptx::mbarrier_init(&inputs_seen[s], 1);
      ptx::mbarrier_init(&desc_empty[s], kConsumerWarps * 32 + 2);
    }
    abort = 0;
    filled_stages = filled_descs = 0;
    producer_left = 0;
  }

  // Spins until the phase of the given parity has completed; false if the block aborted meanwhile.
  __device__ __forceinline__ bool wait(uint64_t* bar, uint32_t parity) {
    while (!ptx::mbarrier_try_wait_parity(bar, parity))
      if (abort) return false;
    return true;
  }

  // The producer, as it leaves (lane 0; at the end of its list or on an abort).
  __device__ void publish_filled(uint32_t stages, uint32_t descs) {
    filled_stages = stages;
    filled_descs = descs;
    cuda::atomic_ref<int, cuda::thread_scope_block>(producer_left).store(1, cuda::memory_order_release);
  }

  // A consumer's wait for position `pos` of a ring whose fill count the producer publishes as `filled`:
  // like wait(), but on an abort it gives up only if the producer left without filling `pos` (above).
  __device__ __forceinline__ bool wait_filled(uint64_t* bar, uint32_t parity, const uint32_t* filled, uint32_t pos) {
    while (!ptx::mbarrier_try_wait_parity(bar, parity))
      if (abort) return wait_filled_after_abort(bar, parity, filled, pos);
    return true;
  }
  // The abort path of wait_filled.
  __device__ __forceinline__ bool wait_filled_after_abort(uint64_t* bar, uint32_t parity, const uint32_t* filled,
                                                       uint32_t pos) {
    while (cuda::atomic_ref<int, cuda::thread_scope_block>(producer_left).load(cuda::memory_order_acquire) == 0) {
    }
    if (pos >= *filled) return false;
    while (!ptx::mbarrier_try_wait_parity(bar, parity)) {  // filled: its copies or stores land
    }
    return true;
  }
};

// An L2 cache policy for bytes a step reads exactly once (weight rows, K/V tiles): their lines are the first
// a set gives up, so the ~120 MB a batch-1 layer streams through the 50 MB L2 no longer evicts what other SMs
// read next (activations, scores, routes, attention partials, barrier counters). Without it those reads
// went to HBM on the layer's critical path: with it the batch-1 step took 12.6% less time (router inputs 3.7
// -> 2.4 us, attention combine 6.0 -> 3.7 us a task), batch 8 4.0% and batch 64 2.8% less (PERF_LOG #101).
// cuda::ptx has no createpolicy or cache-hinted bulk copy, hence the asm.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// An L2 prefetch of `bytes` (a multiple of 16) at `src` (16-byte aligned), evict-normal: the lines stay in L2
// while the evict-first weight stream passes through it, until the copy that reads them. A hint with no completion
// to wait for. The CCCL of CUDA 13.0 has no cp_async_bulk_prefetch, hence the asm.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile(
      "{\n\t.reg .b64 policy;\n\t"
      "createpolicy.fractional.L2::evict_normal.b64 policy, 1.0;\n\t"
      "cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, policy;\n\t}"
      :
      : "l"(src), "r"(bytes)
      : "memory");
}

// The producer's view of the stage ring (lane 0 of the producer warp only).
//
// At most `in_flight` of its stages are in flight (issued, not yet landed) at once (the step's
// stages_in_flight, layout.stages_in_flight_for); the ring's other buffers hold landed stages the consumers
// have not read yet. Why a cap: a fence (the signaller's release; a dependency wait acquires with a load, no
// fence, since session AD) waits for every request its SM has in flight, these copies included, and they answer behind the whole GPU's bytes in flight
// (L2 loads queue far less), which with the whole ring in flight on every SM is ~21 MB, ~5 us of HBM time,
// while ~64 KB an SM keeps HBM near its copy bandwidth (the fence probe: fence.acq_rel.gpu 2.2 us at 64 KB an
// SM, 8.4 us at 160 KB). A bandwidth-bound batch still wants the whole ring.
struct StageProducer {
  PipelineStorage& p;
  uint32_t in_flight;  // 1 .. kStages
  uint32_t n = 0;      // stages issued so far
  uint64_t read_once = l2_evict_first_policy();

  // Claims the next buffer and announces `bytes` of copies into it; nullptr if the block aborted. Under a cap
  // it first waits for stage n - in_flight to land: issued copies land without anyone's help, so this cannot
  // deadlock, and that stage's buffer is not refilled before stage n (in_flight < kStages), so its full
  // barrier still shows the phase this waits for.
  __device__ uint8_t* begin(uint32_t bytes) {
    if (in_flight < (uint32_t)kStages && n >= in_flight) {
      const uint32_t m = n - in_flight;
      if (!p.wait(&p.full[m % kStages], (m / kStages) & 1)) return nullptr;
    }
    const int s = n % kStages;
    if (!p.wait(&p.empty[s], ((n / kStages) & 1) ^ 1)) return nullptr;
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &p.full[s], bytes);
    return p.stage[s];
  }
  // One bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) into the claimed buffer.
  __device__ void copy(uint8_t* dst, const void* src, uint32_t bytes) {
    ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, dst, src, bytes, &p.full[n % kStages]);
  }
  // The same for bytes this step reads only here (weight rows, K/V tiles): evict-first in L2 (above).
  __device__ void copy_read_once(uint8_t* dst, const void* src, uint32_t bytes) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
        :
        : "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes),
          "r"((uint32_t)__cvta_generic_to_shared(&p.full[n % kStages])), "l"(read_once)
        : "memory");
  }
  __device__ void end() { ++n; }
};

// A consumer warp's view of the stage ring.
struct StageConsumer {
  PipelineStorage& p;
  uint32_t n = 0;  // stages consumed so far

  // The stage `ahead` places after the next once its copies have landed, without releasing the ones before
  // it; nullptr if the block aborted before the producer filled it. At most kStages may be held at once: the
  // producer refills a buffer only after its release.
  __device__ const uint8_t* wait_ahead(int ahead) {
    const uint32_t m = n + ahead;
    const int s = m % kStages;
    if (!p.wait_filled(&p.full[s], (m / kStages) & 1, &p.filled_stages, m)) return nullptr;
    return p.stage[s];
  }
  // The next stage once its copies have landed; nullptr as wait_ahead().
  __device__ const uint8_t* wait() { return wait_ahead(0); }
  // After this lane is done reading the stage (every lane of every consumer warp calls it). The producer
  // refills the buffer with cp.async.bulk, a write of the async proxy, and our reads were the generic proxy's:
  // the PTX memory model orders them only through a proxy fence, which covers the executing thread's own
  // accesses, so each lane fences and then arrives itself (release, CTA scope) -- an arrival by lane 0 after
  // __syncwarp() leaves lanes 1-31's reads unordered for compute-sanitizer 2026.4's racecheck. The producer's
  // acquire wait on empty[s] then precedes its copies.
  __device__ void release() {
    ptx::fence_proxy_async(ptx::space_shared);
    ptx::mbarrier_arrive(&p.empty[n % kStages]);
    ++n;
  }
};

}  // namespace vllm_megakernel

// Does an SM's round trip to L2 wait behind the bytes its own bulk copies have in flight?
//
// The megakernel's producer keeps its whole stage ring in flight (5 x 32 KB an SM). Session AB's batch-1 and
// batch-8 traces (PERF_LOG #133) show the signaller's fence (a task's compute end to its signal) taking 0.4 us
// when the SM's next task streams nothing and 1.5-2.2 us (p90 up to 5 us) when it streams weights. If answers
// to an SM's requests queue behind its in-flight copy data, every round trip on a streaming SM (a fence, a
// barrier poll, an activation read) costs about its in-flight bytes over its share of HBM bandwidth.
//
// One block per SM. A streamer warp keeps N bulk copies of 16 KB in flight (each issued when the one N back
// has landed; the data is never read); a prober warp times, on its own SM, a gpu-scope fence, an L2 load
// (ld.relaxed.gpu) and a store followed by a fence -- the signaller's pattern. Printed: for each in-flight
// depth, with every SM streaming and with one SM streaming alone, the aggregate bandwidth and each probe's
// median and p90 latency. A third set (session AC) tells the SM's own in-flight bytes from everyone's: a few
// probing SMs stream at one depth while every other SM streams at another (it showed the fence waiting for its own
// SM's copies: PERF_LOG #139). A fourth times one dependency hop between two SMs under the same loads, by protocol:
// main's (fence on both sides), an acquire load on the waiter's side, and a data-flag store with no fence at all.
//
// Build (CPU machine): nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -o build/fence_probe
//   benchmarks/candidates/fence-probe/fence_probe.cu
// Run (GPU host): build/fence_probe
#include <cuda/ptx>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../probe_util.cuh"

namespace ptx = cuda::ptx;

constexpr int kChunk = 16384;  // bytes per bulk copy (the megakernel's stages are 32 KB, in one copy or two)
constexpr int kRing = 10;      // 160 KB of landing buffers: the deepest depth probed
constexpr int kProbes = 256;
constexpr int kKinds = 3;  // fence, load, store + fence
constexpr int kThreads = 64;

// Spins until the chunk's copy has landed; traps after 100 ms (a copy that never lands: no silent hang).
__device__ __forceinline__ void wait_landed(uint64_t* bar, uint32_t parity) {
  unsigned long long t0 = 0;
  for (int spins = 0; !ptx::mbarrier_try_wait_parity(bar, parity); ++spins) {
    const unsigned long long t = globaltimer_ns();
    if (spins == 0) t0 = t;
    if (t - t0 > 100000000ull) {
      printf("fence_probe: block %d: a bulk copy did not land within 100 ms\n", blockIdx.x);
      __trap();
    }
  }
}

struct Shared {
  alignas(128) uint8_t buf[kRing][kChunk];
  uint64_t full[kRing];
  volatile int stop;
  volatile unsigned long long issued;
  unsigned lat[kProbes][kKinds];  // the prober's cycles

  // Thread 0, before the block-wide barrier that precedes any use.
  __device__ void init() {
    for (int s = 0; s < kRing; ++s) ptx::mbarrier_init(&full[s], 1);
    stop = 0;
    issued = 0;
  }
};

// 50 us: every SM's stream reaches steady state before anything is timed.
__device__ void settle() {
  const unsigned long long warm = globaltimer_ns();
  while (globaltimer_ns() - warm < 50000) {
  }
}

// A non-timing block's wait for the timing ones to be done (`*done` at least `n`), polling every ~2 us (little
// traffic); bounded, so that blocks that are not all resident cannot hang the probe.
__device__ void wait_done(const unsigned* done, unsigned n) {
  for (const unsigned long long t = globaltimer_ns(); globaltimer_ns() - t < 100000000ull; __nanosleep(2000))
    if (*(const volatile unsigned*)done >= n) break;
}

// The streamer (lane 0 of a block's warp 0): keeps `depth` bulk copies of kChunk bytes in flight, reading `base`'s
// region from chunk `first_chunk` on, until S.stop; leaves no copy in flight.
__device__ void stream(Shared& S, const uint8_t* base, size_t region, size_t first_chunk, int my_depth) {
  // evict-first in L2, as the megakernel's weight and K/V copies (pipeline.cuh): the stream must not evict the
  // prober's line, or its loads would time HBM misses instead of the queue this measures
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  uint32_t i = 0;
  for (; !S.stop; ++i) {
    if (i >= (uint32_t)my_depth) {  // chunk i - my_depth has landed: at most `my_depth` in flight
      const uint32_t m = i - my_depth;
      wait_landed(&S.full[m % kRing], (m / kRing) & 1);
    }
    const int s = i % kRing;  // its last use, chunk i - kRing, landed (kRing >= my_depth)
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &S.full[s], kChunk);
    const uint8_t* from = base + (first_chunk + i) * kChunk % region;
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
        :
        : "r"((uint32_t)__cvta_generic_to_shared(S.buf[s])), "l"(from), "r"(kChunk),
          "r"((uint32_t)__cvta_generic_to_shared(&S.full[s])), "l"(policy)
        : "memory");
    S.issued = i + 1;
  }
  for (uint32_t m = i > (uint32_t)kRing ? i - kRing : 0; m < i; ++m)  // no exit with copies in flight
    wait_landed(&S.full[m % kRing], (m / kRing) & 1);
}

__global__ void __launch_bounds__(kThreads, 1)
    probe_kernel(const uint8_t* src, size_t region, size_t first_chunk, int depth, int streaming_blocks,
                 int probers, int prober_depth, unsigned* word, unsigned* probers_done, unsigned long long* lat,
                 unsigned long long* window) {
  extern __shared__ __align__(128) uint8_t smem[];
  Shared& S = *reinterpret_cast<Shared*>(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) S.init();
  __syncthreads();
  // blocks 0 .. probers - 1 probe and stream at prober_depth, the others stream at depth
  const int my_depth = (int)blockIdx.x < probers ? prober_depth : depth;
  const bool streams = my_depth > 0 && (int)blockIdx.x < streaming_blocks;
  if (warp == 0) {
    if (lane == 0 && streams) stream(S, src + region * blockIdx.x, region, first_chunk, my_depth);
    return;
  }
  // warp 1, lane 0: the prober on blocks 0 .. probers - 1; on the other blocks it only keeps its block's streamer
  // going until every prober is done, and records the streamer's window
  if (lane != 0) return;
  if ((int)blockIdx.x >= probers) {
    settle();
    const unsigned long long t_start = globaltimer_ns(), issued0 = S.issued;
    wait_done(probers_done, (unsigned)probers);
    window[blockIdx.x * 4 + 0] = globaltimer_ns() - t_start;
    window[blockIdx.x * 4 + 2] = S.issued - issued0;
    S.stop = 1;
    return;
  }
  unsigned* my_word = word + blockIdx.x * 32;  // its own 128-byte line
  settle();
  const unsigned long long t_start = globaltimer_ns(), c_start = clock64(), issued0 = S.issued;
  // latencies kept in shared memory until the end: a store of the last one would sit in front of the next fence
  unsigned sink = 0;
  for (int k = 0; k < kProbes; ++k) {
    long long t0 = clock64();
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    long long t1 = clock64();
    S.lat[k][0] = (unsigned)(t1 - t0);
    unsigned v;
    t0 = clock64();
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(my_word) : "memory");
    // the clock read comes after an instruction that reads the loaded value (ptxas makes it a compare and a
    // select around an unpredicated clock read): in-order issue stops it until the load has answered
    asm volatile("{ .reg .pred p; setp.eq.u32 p, %1, 0xdeadbeef; @p mov.u64 %0, 0; @!p mov.u64 %0, %%clock64; }"
                 : "=l"(t1) : "r"(v) : "memory");
    S.lat[k][1] = (unsigned)(t1 - t0);
    sink += v;
    t0 = clock64();
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(my_word + 1), "r"(sink + k) : "memory");
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    t1 = clock64();
    S.lat[k][2] = (unsigned)(t1 - t0);
    const long long pause = clock64();
    while (clock64() - pause < 4000) {  // ~2 us between probes
    }
  }
  const unsigned long long t_end = globaltimer_ns(), c_end = clock64(), issued1 = S.issued;
  // every streamer runs until the last prober is done, so that no prober's last probes meet a quieter GPU (a
  // bounded wait: blocks that are not all resident must not hang the probe)
  atomicAdd(probers_done, 1u);
  for (const unsigned long long t = globaltimer_ns(); globaltimer_ns() - t < 100000000ull;)
    if (*(volatile unsigned*)probers_done >= (unsigned)probers) break;
  S.stop = 1;
  window[blockIdx.x * 4 + 0] = t_end - t_start;
  window[blockIdx.x * 4 + 1] = c_end - c_start;
  window[blockIdx.x * 4 + 2] = issued1 - issued0;
  window[blockIdx.x * 4 + 3] = sink;
  unsigned long long* out = lat + (size_t)blockIdx.x * kProbes * kKinds;
  for (int k = 0; k < kProbes; ++k)
    for (int j = 0; j < kKinds; ++j) out[k * kKinds + j] = S.lat[k][j];
}

// One dependency hop between two SMs, timed as half a ping-pong's round trip, under the load the megakernel puts
// on them: blocks 0 and 1 stream at `pair_depth` (their producers' copies in flight) while every other block streams
// at `depth`. Protocols, as a signaller and a waiter would use them:
//   0 fence: data store, fence.acq_rel.gpu, flag store; poll the flag relaxed, then fence.acq_rel.gpu (main's wait);
//   1 acquire: the same signal; poll the flag with ld.acquire.gpu (benchmarks/candidates/acquire-load.patch);
//   2 data-flag: one 8-byte store of {data, round}; poll the 8 bytes until the round shows (NCCL's LL protocol: no
//     fence on either side; as a probe only, since PTX does not promise that the vector store is seen whole).
constexpr int kHopRounds = 200, kHopWarmup = 20;

__global__ void __launch_bounds__(kThreads, 1)
    hop_kernel(const uint8_t* src, size_t region, size_t first_chunk, int depth, int pair_depth, int protocol,
               unsigned* inbox, unsigned* pair_done, unsigned long long* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  Shared& S = *reinterpret_cast<Shared*>(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) S.init();
  __syncthreads();
  const bool pair = blockIdx.x < 2;
  const int my_depth = pair ? pair_depth : depth;
  if (warp == 0) {
    if (lane == 0 && my_depth > 0) stream(S, src + region * blockIdx.x, region, first_chunk, my_depth);
    return;
  }
  if (lane != 0) return;
  settle();
  if (!pair) {  // keep streaming until block 0 has its rounds
    wait_done(pair_done, 1u);
    S.stop = 1;
    return;
  }
  unsigned* mine = inbox + blockIdx.x * 32;          // its own 128-byte line: [0] flag or {data, round}, [1] data
  unsigned* theirs = inbox + (blockIdx.x ^ 1) * 32;
  unsigned errors = 0;
  auto send = [&](unsigned r) {
    const unsigned payload = r * 7u + 1u;
    if (protocol == 2) {
      asm volatile("st.relaxed.gpu.global.v2.u32 [%0], {%1, %2};" ::"l"(theirs), "r"(payload), "r"(r) : "memory");
    } else {
      asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(theirs + 1), "r"(payload) : "memory");
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
      asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(theirs), "r"(r) : "memory");
    }
  };
  auto receive = [&](unsigned r) {
    unsigned v = 0, f = 0;
    const unsigned long long t0 = globaltimer_ns();
    for (;;) {
      if (protocol == 2)
        asm volatile("ld.relaxed.gpu.global.v2.u32 {%0, %1}, [%2];" : "=r"(v), "=r"(f) : "l"(mine) : "memory");
      else if (protocol == 1)
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(f) : "l"(mine) : "memory");
      else
        asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(f) : "l"(mine) : "memory");
      if (f == r) break;
      if (globaltimer_ns() - t0 > 100000000ull) {  // 100 ms: the other side is gone; count it and go on
        ++errors;
        return;
      }
    }
    if (protocol == 0) asm volatile("fence.acq_rel.gpu;" ::: "memory");
    if (protocol != 2) asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(mine + 1) : "memory");
    if (v != r * 7u + 1u) ++errors;
  };
  long long c0 = 0;
  unsigned long long t0 = 0;
  for (unsigned r = 1; r <= kHopRounds + kHopWarmup; ++r) {
    if (r == kHopWarmup + 1) c0 = clock64(), t0 = globaltimer_ns();
    const long long c = clock64();
    if (blockIdx.x == 0) {
      send(r);
      receive(r);
      if (r > kHopWarmup) S.lat[r - kHopWarmup - 1][0] = (unsigned)(clock64() - c);
    } else {
      receive(r);
      send(r);
    }
  }
  if (blockIdx.x == 0) {
    out[0] = globaltimer_ns() - t0;
    out[1] = clock64() - c0;
    out[2] = errors;
    for (int k = 0; k < kHopRounds; ++k) out[4 + k] = S.lat[k][0];
    atomicExch(pair_done, 1u);
  }
  S.stop = 1;
}

static double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, (size_t)(q * v.size()))];
}

int main() {
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const size_t region = 32ull << 20;  // 32 MB a block: 4.2 GB over 132 SMs, far past the 50 MB L2
  uint8_t* src;
  unsigned* word;
  unsigned long long *lat, *window;
  unsigned* probers_done;
  CHECK(cudaMalloc(&src, region * sms));
  CHECK(cudaMemset(src, 1, region * sms));
  CHECK(cudaMalloc(&word, sms * 128));
  CHECK(cudaMemset(word, 0, sms * 128));
  CHECK(cudaMalloc(&lat, sizeof(unsigned long long) * sms * kProbes * kKinds));
  CHECK(cudaMalloc(&window, sizeof(unsigned long long) * sms * 4));
  CHECK(cudaMalloc(&probers_done, sizeof(unsigned)));
  const size_t smem = sizeof(Shared);
  CHECK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  // Both kernels take the same dynamic shared memory, above the 48 KB default: each needs the attribute (session
  // AD's first hop launch failed with "invalid argument" without it).
  CHECK(cudaFuncSetAttribute(hop_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  std::printf("%d SMs; probes: fence = fence.acq_rel.gpu, load = ld.relaxed.gpu (L2), store+fence = st.relaxed.gpu "
              "then fence.acq_rel.gpu; ns from clock64 at the SM clock measured in the same window\n\n", sms);
  // One probe_kernel launch (its arguments after first_chunk, which moves on by launch so that each starts where
  // the last one's reads are least likely to linger in L2): the latencies in ns by kind of its first `probers`
  // blocks, and the GB/s of the blocks below `streamers`, each block's bytes over its own window.
  size_t first_chunk = 0;
  struct Probed {
    std::vector<double> v[kKinds];
    double gbps = 0;
  };
  auto probe = [&](size_t block_region, int depth, int streaming, int probers, int prober_depth, int streamers) {
    CHECK(cudaMemset(probers_done, 0, sizeof(unsigned)));
    CHECK(cudaMemset(window, 0, sizeof(unsigned long long) * sms * 4));
    probe_kernel<<<sms, kThreads, smem>>>(src, block_region, first_chunk, depth, streaming, probers, prober_depth,
                                           word, probers_done, lat, window);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    first_chunk += 977;
    std::vector<unsigned long long> h(sms * kProbes * kKinds), w(sms * 4);
    CHECK(cudaMemcpy(h.data(), lat, h.size() * sizeof(h[0]), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(w.data(), window, w.size() * sizeof(w[0]), cudaMemcpyDeviceToHost));
    const double ns_per_cycle = (double)w[0] / (double)w[1];  // block 0 always probes
    Probed r;
    for (int b = 0; b < streamers; ++b)
      if (w[b * 4]) r.gbps += (double)w[b * 4 + 2] * kChunk / (double)w[b * 4];
    for (int b = 0; b < probers; ++b)
      for (int k = 0; k < kProbes; ++k)
        for (int j = 0; j < kKinds; ++j) r.v[j].push_back(h[((size_t)b * kProbes + k) * kKinds + j] * ns_per_cycle);
    return r;
  };
  std::printf("| streaming SMs | in flight an SM (KB) | GB/s (all streaming SMs) | fence median / p90 ns | "
              "load median / p90 ns | store+fence median / p90 ns |\n|---|---|---|---|---|---|\n");
  const int depths[] = {0, 1, 2, 3, 4, 6, 10};
  for (int one = 0; one < 2; ++one) {
    for (int depth : depths) {
      const int streaming = depth == 0 ? (one ? 1 : 0) : (one ? 1 : sms);  // depth 0, one: block 0 probes alone
      const int probers = streaming > 0 ? streaming : sms;
      // one SM alone streams the whole allocation (4.2 GB, far past the L2), every SM its own 32 MB
      const Probed r = probe(one ? region * sms : region, depth, streaming, probers, depth, depth ? streaming : 0);
      std::printf("| %d%s | %d | %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f |\n", depth ? streaming : 0,
                  probers == 1 ? " (block 0 probes alone)" : "", depth * kChunk / 1024, r.gbps, pct(r.v[0], 0.5),
                  pct(r.v[0], 0.9), pct(r.v[1], 0.5), pct(r.v[1], 0.9), pct(r.v[2], 0.5), pct(r.v[2], 0.9));
    }
  }
  // Own bytes or everyone's: kMixedProbers SMs probe while streaming at their own depth, every other SM streams at
  // the other depth. If a fence waits behind its own SM's copies, it follows the probers' column; if behind the
  // whole GPU's, the others'.
  constexpr int kMixedProbers = 4;
  std::printf("\n| probing SMs' in flight (KB) | other SMs' in flight (KB) | GB/s (all SMs) | fence median / p90 ns | "
              "load median / p90 ns | store+fence median / p90 ns |\n|---|---|---|---|---|---|\n");
  const int mixed[][2] = {{0, 10}, {1, 10}, {2, 10}, {10, 10}, {0, 2}, {10, 2}, {0, 4}, {10, 4}};
  for (const auto& m : mixed) {
    const int own = m[0], others = m[1];
    const Probed r = probe(region, others, sms, kMixedProbers, own, sms);
    std::printf("| %d | %d | %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f |\n", own * kChunk / 1024,
                others * kChunk / 1024, r.gbps, pct(r.v[0], 0.5), pct(r.v[0], 0.9), pct(r.v[1], 0.5), pct(r.v[1], 0.9),
                pct(r.v[2], 0.5), pct(r.v[2], 0.9));
  }
  // One hop between two SMs (hop_kernel): the round trip over two, by protocol, under the pair's own copies in
  // flight and the other SMs'.
  static_assert(kHopRounds <= kProbes, "the round times fit the prober's shared array");
  unsigned* inbox;
  unsigned long long* hop_out;
  CHECK(cudaMalloc(&inbox, 2 * 128));
  CHECK(cudaMalloc(&hop_out, sizeof(unsigned long long) * (4 + kHopRounds)));
  std::printf("\n| protocol | pair's own in flight (KB) | other SMs' in flight (KB) | hop median / p90 ns | errors |\n"
              "|---|---|---|---|---|\n");
  const char* protocol_name[] = {"fence (main)", "acquire load", "data-flag"};
  const int loads[][2] = {{0, 0}, {4, 0}, {4, 4}, {10, 0}, {10, 4}, {10, 10}};  // {others, pair} in chunks
  for (const auto& l : loads)
    for (int protocol = 0; protocol < 3; ++protocol) {
      CHECK(cudaMemset(inbox, 0, 2 * 128));
      CHECK(cudaMemset(probers_done, 0, sizeof(unsigned)));
      hop_kernel<<<sms, kThreads, smem>>>(src, region, first_chunk, l[0], l[1], protocol, inbox, probers_done, hop_out);
      CHECK(cudaGetLastError());
      CHECK(cudaDeviceSynchronize());
      first_chunk += 977;
      std::vector<unsigned long long> h(4 + kHopRounds);
      CHECK(cudaMemcpy(h.data(), hop_out, h.size() * sizeof(h[0]), cudaMemcpyDeviceToHost));
      const double ns_per_cycle = (double)h[0] / (double)h[1];
      std::vector<double> hop;
      for (int k = 0; k < kHopRounds; ++k) hop.push_back(h[4 + k] * ns_per_cycle / 2);
      std::printf("| %s | %d | %d | %.0f / %.0f | %llu |\n", protocol_name[protocol], l[1] * kChunk / 1024,
                  l[0] * kChunk / 1024, pct(hop, 0.5), pct(hop, 0.9), h[2]);
    }
  return 0;
}

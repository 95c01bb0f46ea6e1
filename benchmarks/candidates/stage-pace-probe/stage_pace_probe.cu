// How fast do the consumers take a stage that is already in shared memory: the eight consumer warps of today's
// kernel against four (one group of the two-consumer-group form, benchmarks/candidates/README.md; PERF_LOG #203:
// in the fluid model that form gains ~4.5% at batch 1 if four warps take a stage in ~0.6 us, where eight take
// ~0.45 us, and loses ~7% at 0.9 us).
//
// One block per SM. The stages never leave shared memory: a ring of 4 x 32 KB filled once with random bf16, so what
// is timed is the consumers' own side of the stage ring, the same protocol as csrc/pipeline.cuh: a producer warp
// that "refills" buffer s by an arrive on full[s] once every consumer lane has released it (empty[s], count W x 32),
// and W consumer warps that wait on full[s] with the use's parity, run the GEMM body's per-stage work and release
// (each lane: a shared-memory proxy fence, then its own arrive). The per-stage work is the kernel's own
// (csrc/ops/gemm.cuh's ActTile and mma_stage, with the warp count as their template parameter) at a batch of at
// most 8 rows: the K columns split over the W warps (K / (32 W) 32-column chunks a warp), each lane's activation
// slice in registers for the whole run, two independent mma chains, the stage's partial sums stored to shared
// memory.
//
// Printed, per GEMM shape (K, rows per stage: layout.rows_per_stage) and warp count: ns per stage, the median over
// the blocks of the timed launch (each block's consumer warp 0 times its own run with %globaltimer), after a warm-up
// launch; and four warps' time against eight's. The attention tile's pace (0.9 us in the model) is not covered.
//
// Build (CPU machine): nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -Xptxas -v \
//   -o build/stage_pace_probe benchmarks/candidates/stage-pace-probe/stage_pace_probe.cu
// Run (GPU host): build/stage_pace_probe
#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "../../../csrc/ops/gemm.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../probe_util.cuh"

namespace ptx = cuda::ptx;
using vllm_megakernel::ActTile;
using vllm_megakernel::DenseRows;
using vllm_megakernel::mma_stage;

constexpr int kStageBytes = vllm_megakernel::kStageBytes, kRing = 4, kStagesTimed = 8192, kBatchRows = 8;
constexpr int kPartRows = 16;  // mma_stage's row stride in the partial sums: at most 16 rows a stage

struct Shared {
  alignas(128) uint8_t stage[kRing][kStageBytes];
  float part[8 * kPartRows * kBatchRows];  // (warp, row of the stage, batch row): at most 8 warps x 16 rows
  uint64_t full[kRing];
  uint64_t empty[kRing];
};

// Spins on a ring barrier; traps after ~2 s (no silent hang).
__device__ __forceinline__ void wait_parity(uint64_t* bar, uint32_t parity, int what) {
  const unsigned long long t0 = globaltimer_ns();
  while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
    if (globaltimer_ns() - t0 > 2000000000ull) {
      printf("stage_pace_probe: block %d thread %d: %s barrier stalled\n", blockIdx.x, threadIdx.x,
             what ? "empty" : "full");
      __trap();
    }
  }
}

// W consumer warps (warps 0..W-1) and a producer warp (warp W). ns[block]: consumer warp 0's time for the run.
template <int W, int K, int RS>
__global__ void __launch_bounds__((W + 1) * 32, 1)
    pace(const __nv_bfloat16* act, int nstages, unsigned long long* ns, float* sink) {
  static_assert(RS * K * 2 <= kStageBytes && RS <= kPartRows, "a stage holds RS whole rows");
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Shared& s = *reinterpret_cast<Shared*>(smem_raw);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Fill the ring once (random bf16 from the host's activation buffer: the values do not matter, only that the
  // mma sees finite numbers).
  for (int i = threadIdx.x; i < kRing * kStageBytes / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(&s.stage[0][0])[i] = reinterpret_cast<const uint4*>(act)[i % (kBatchRows * K / 8)];
  if (threadIdx.x == 0) {
    for (int b = 0; b < kRing; ++b) {
      ptx::mbarrier_init(&s.full[b], 1);
      ptx::mbarrier_init(&s.empty[b], W * 32);
    }
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
  }
  __syncthreads();

  if (warp == W) {  // the producer: every buffer use is an arrive on full once the consumers released the last one
    if (lane == 0) {
      for (int n = 0; n < nstages; ++n) {
        const int b = n % kRing;
        if (n >= kRing) wait_parity(&s.empty[b], ((n / kRing) & 1) ^ 1, 1);
        ptx::mbarrier_arrive(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &s.full[b]);
      }
    }
    return;
  }

  // The consumers: this lane's activation slice of the batch's up to 8 rows, in registers for the whole run.
  ActTile<K, 1, W> a;
  a.load(DenseRows{act, K, kBatchRows}, 0, warp, lane);
  const unsigned long long t0 = globaltimer_ns();
  for (int n = 0; n < nstages; ++n) {
    const int b = n % kRing;
    wait_parity(&s.full[b], (n / kRing) & 1, 0);
    mma_stage<K, RS, 1, W>(s.stage[b], a, s.part, kPartRows, kBatchRows, 0, 0, warp, lane);
    ptx::fence_proxy_async(ptx::space_shared);  // as StageConsumer::release: each lane fences, then arrives
    ptx::mbarrier_arrive(&s.empty[b]);
  }
  const unsigned long long t1 = globaltimer_ns();
  __syncwarp();
  const float check = s.part[(warp * kPartRows + (lane & 15)) * kBatchRows + (lane >> 4)];
  if (warp == 0 && lane == 0) ns[blockIdx.x] = t1 - t0;
  sink[blockIdx.x * 32 * W + threadIdx.x] = check;  // keeps the sums live
}

template <int W, int K, int RS>
double time_one(const __nv_bfloat16* act, int sms, unsigned long long* d_ns, float* d_sink) {
  auto kernel = pace<W, K, RS>;
  const int smem = (int)sizeof(Shared);
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  for (int run = 0; run < 2; ++run) {  // a warm-up launch, then the timed one
    kernel<<<sms, (W + 1) * 32, smem>>>(act, kStagesTimed, d_ns, d_sink);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
  }
  std::vector<unsigned long long> ns(sms);
  CHECK(cudaMemcpy(ns.data(), d_ns, sms * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  std::sort(ns.begin(), ns.end());
  return (double)ns[sms / 2] / kStagesTimed;
}

template <int K, int RS>
void shape(const char* name, const __nv_bfloat16* act, int sms, unsigned long long* d_ns, float* d_sink) {
  const double eight = time_one<8, K, RS>(act, sms, d_ns, d_sink);
  const double four = time_one<4, K, RS>(act, sms, d_ns, d_sink);
  std::printf("| %s | %d | %d | %.0f | %.0f | %.2fx |\n", name, K, RS, eight, four, four / eight);
}

int main() {
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, dev));
  constexpr int kMaxK = 4096;
  std::vector<__nv_bfloat16> host(kBatchRows * kMaxK);
  unsigned r = 12345u;
  for (auto& v : host) {
    r = r * 1664525u + 1013904223u;
    v = __float2bfloat16(((r >> 9) & 0xffff) / 65536.f - 0.5f);
  }
  __nv_bfloat16* act;
  unsigned long long* d_ns;
  float* d_sink;
  CHECK(cudaMalloc(&act, host.size() * sizeof(host[0])));
  CHECK(cudaMemcpy(act, host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&d_ns, sms * sizeof(unsigned long long)));
  CHECK(cudaMalloc(&d_sink, (size_t)sms * 32 * 8 * sizeof(float)));
  std::printf("%s, %d SMs: one block an SM, %d stages a launch, resident 32 KB stages (no HBM), batch <= 8 rows; "
              "ns a stage, the median block of the second launch\n\n",
              prop.name, sms, kStagesTimed);
  std::printf("| shape | K | rows a stage | 8 warps ns | 4 warps ns | 4 / 8 |\n|---|---|---|---|---|---|\n");
  shape<2048, 8>("QKV, router, up/gate", act, sms, d_ns, d_sink);
  shape<4096, 4>("O projection", act, sms, d_ns, d_sink);
  shape<768, 16>("down", act, sms, d_ns, d_sink);
  CHECK(cudaFree(act));
  CHECK(cudaFree(d_ns));
  CHECK(cudaFree(d_sink));
  return 0;
}

// What does reading W2 by column slices cost in HBM time? (PERF_LOG #166: the fused expert task pays at batch 1-2
// only if a slice's 2048 segments of 2 x C bytes, at W2's 1536-byte row stride, stream at the copy bandwidth of their
// own bytes; if HBM moves whole 128-byte lines, 48-column slices cost a third more and the task gains nothing.)
//
// A W2-shaped tensor, [experts x 2048 rows, 768 columns] bf16 (201 MB: more than L2), is read exactly once per pass,
// one block per SM, its producer thread keeping D stages in flight in a ring of 5 (D = 2, the megakernel's cap at batch 1,
// and 5, the whole ring; layout.stages_in_flight_for), every copy with the megakernel's evict-first L2 policy (the data
// is never read). For each slice width C = 32, 48, 64 columns:
//   - contiguous: the tensor in copies of one slice box's bytes (16 / 24 / 32 KB), consecutive rows, what the up/gate
//     and down waves stream today at the same bytes a stage;
//   - slices: every (expert, column slice) is a task of 2048 rows, loaded as 2-D TMA boxes of 256 rows x C columns
//     through a tensor map, for each L2 promotion the map allows. Tasks are dealt in slice order (an expert's slices
//     on consecutive SMs at about the same time, as the claimed wave hands them out at batch 1), and in a scattered
//     order (every expert's even slices, then the odd ones: neighbouring slices ~100 MB apart, past L2, so no
//     neighbour's lines are there to share).
// Printed: each mode's time (median of 5 passes after 1 warm-up, CUDA events), its bandwidth over the tensor's own
// bytes, and its ratio to the contiguous pass of the same C and D.
//
// Build (CPU machine): nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -o build/tma_slice_probe
//   benchmarks/candidates/tma-slice-probe/tma_slice_probe.cu
// Run (GPU host): build/tma_slice_probe
#include <cuda.h>
#include <cuda/ptx>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../probe_util.cuh"

namespace ptx = cuda::ptx;

constexpr int kExperts = 64, kRows = 2048, kCols = 768;  // one MoE layer's W2 is 128 x 2048 x 768; half is past L2
constexpr int kStage = 32768, kRing = 5, kThreads = 32, kBoxRows = 256;  // a box: 256 rows x C columns
constexpr int kWidths[] = {32, 48, 64};

struct Shared {
  alignas(128) uint8_t buf[kRing][kStage];
  uint64_t full[kRing];
};

// Spins until stage n's copies have landed; traps after ~100 ms (no silent hang).
__device__ __forceinline__ void wait_landed(Shared& s, uint32_t n) {
  const unsigned long long t0 = clock64();
  while (!ptx::mbarrier_try_wait_parity(&s.full[n % kRing], (n / kRing) & 1)) {
    if (clock64() - t0 > 200000000ull) {
      printf("tma_slice_probe: block %d: stage %u did not land\n", blockIdx.x, n);
      __trap();
    }
  }
}

__device__ __forceinline__ uint64_t evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// Before stage n: at most `depth` (<= kRing) stages in flight. Waiting for stage n - depth also frees buffer n % kRing,
// whose last stage, n - kRing, was waited for when stage n - kRing + depth was issued.
__device__ __forceinline__ uint64_t* claim_stage(Shared& s, uint32_t n, int depth, uint32_t bytes) {
  if (n >= (uint32_t)depth) wait_landed(s, n - depth);
  uint64_t* bar = &s.full[n % kRing];
  ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, bytes);
  return bar;
}

// After the last stage (n issued): the ones not waited for yet, n - depth .. n - 1.
__device__ __forceinline__ void drain(Shared& s, uint32_t n, int depth) {
  for (uint32_t m = n > (uint32_t)depth ? n - depth : 0; m < n; ++m) wait_landed(s, m);
}

__device__ __forceinline__ void init_ring(Shared& s) {
  for (int i = 0; i < kRing; ++i) ptx::mbarrier_init(&s.full[i], 1);
  ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
}

// Contiguous: the tensor as `chunk`-byte copies, copy k on block k % gridDim.x.
__global__ void __launch_bounds__(kThreads) contiguous(const uint8_t* src, long long bytes, uint32_t chunk, int depth) {
  extern __shared__ __align__(128) uint8_t smem[];
  Shared& s = *reinterpret_cast<Shared*>(smem);
  if (threadIdx.x != 0) return;
  init_ring(s);
  const uint64_t policy = evict_first();
  uint32_t n = 0;
  for (long long k = blockIdx.x; k * chunk < bytes; k += gridDim.x, ++n) {
    uint64_t* bar = claim_stage(s, n, depth, chunk);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
        :
        : "r"((uint32_t)__cvta_generic_to_shared(s.buf[n % kRing])), "l"(src + k * chunk), "r"(chunk),
          "r"((uint32_t)__cvta_generic_to_shared(bar)), "l"(policy)
        : "memory");
  }
  drain(s, n, depth);
}

// Slices: this block's tasks order[blockIdx.x], order[blockIdx.x + gridDim.x], ...; task t is (expert t / S, slice
// t % S) with S = kCols / C slices an expert; its 2048 rows in boxes of kBoxRows.
__global__ void __launch_bounds__(kThreads) slices(const __grid_constant__ CUtensorMap map, const int* order, int tasks,
                                                   int cols, int depth) {
  extern __shared__ __align__(128) uint8_t smem[];
  Shared& s = *reinterpret_cast<Shared*>(smem);
  if (threadIdx.x != 0) return;
  init_ring(s);
  const uint64_t policy = evict_first();
  const int per_expert = kCols / cols;
  const uint32_t box_bytes = (uint32_t)kBoxRows * cols * 2;
  uint32_t n = 0;
  for (int i = blockIdx.x; i < tasks; i += gridDim.x) {
    const int t = order[i], expert = t / per_expert, c0 = (t % per_expert) * cols;
    for (int r = 0; r < kRows; r += kBoxRows, ++n) {
      uint64_t* bar = claim_stage(s, n, depth, box_bytes);
      // cuda::ptx has no cache-hinted tensor copy, hence the asm
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
          " [%0], [%1, {%2, %3}], [%4], %5;"
          :
          : "r"((uint32_t)__cvta_generic_to_shared(s.buf[n % kRing])), "l"(&map), "r"(c0), "r"(expert * kRows + r),
            "r"((uint32_t)__cvta_generic_to_shared(bar)), "l"(policy)
          : "memory");
    }
  }
  drain(s, n, depth);
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

template <class Launch>
float median_ms(Launch launch) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < 6; ++i) {
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaGetLastError());
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    if (i >= 1) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row reaches the file as it is printed, even if the run is cut
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const long long bytes = (long long)kExperts * kRows * kCols * 2;
  uint8_t* w2;
  CHECK(cudaMalloc(&w2, bytes));
  CHECK(cudaMemset(w2, 1, bytes));
  const int smem = sizeof(Shared);
  CHECK(cudaFuncSetAttribute(contiguous, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(slices, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  if (!fn || q != cudaDriverEntryPointSuccess) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
    return 1;
  }
  const auto encode = reinterpret_cast<EncodeTiled>(fn);

  std::printf("W2-shaped tensor %.1f MB, %d SMs, ring %d x %d KB, evict-first copies\n\n", bytes / 1e6, sms, kRing,
              kStage / 1024);
  std::printf("| C | stages in flight | mode | L2 promotion | order | ms | GB/s over the tensor's bytes | against contiguous |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  const struct { CUtensorMapL2promotion p; const char* name; } promos[] = {
      {CU_TENSOR_MAP_L2_PROMOTION_NONE, "none"}, {CU_TENSOR_MAP_L2_PROMOTION_L2_64B, "64B"},
      {CU_TENSOR_MAP_L2_PROMOTION_L2_128B, "128B"}, {CU_TENSOR_MAP_L2_PROMOTION_L2_256B, "256B"}};
  int most_tasks = 0;
  for (int cols : kWidths) most_tasks = std::max(most_tasks, kExperts * (kCols / cols));
  int* order_d;
  CHECK(cudaMalloc(&order_d, sizeof(int) * most_tasks));
  for (int cols : kWidths) {
    const uint32_t box_bytes = (uint32_t)kBoxRows * cols * 2;
    const int per_expert = kCols / cols, tasks = kExperts * per_expert;
    for (int depth : {2, kRing}) {
      const float base = median_ms([&] { contiguous<<<sms, kThreads, smem>>>(w2, bytes, box_bytes, depth); });
      std::printf("| %d | %d | contiguous %u KB copies | - | - | %.3f | %.0f | 1.000 |\n", cols, depth, box_bytes / 1024,
                  base, bytes / base / 1e6);
      for (int scattered = 0; scattered < 2; ++scattered) {
        std::vector<int> order;
        if (!scattered) {
          for (int t = 0; t < tasks; ++t) order.push_back(t);
        } else {  // every expert's even slices, then the odd ones
          for (int parity = 0; parity < 2; ++parity)
            for (int sl = parity; sl < per_expert; sl += 2)
              for (int e = 0; e < kExperts; ++e) order.push_back(e * per_expert + sl);
        }
        CHECK(cudaMemcpy(order_d, order.data(), sizeof(int) * tasks, cudaMemcpyHostToDevice));
        for (const auto& pr : promos) {
          CUtensorMap map;
          const cuuint64_t dims[2] = {(cuuint64_t)kCols, (cuuint64_t)kExperts * kRows};
          const cuuint64_t strides[1] = {(cuuint64_t)kCols * 2};
          const cuuint32_t box[2] = {(cuuint32_t)cols, (cuuint32_t)kBoxRows};
          const cuuint32_t elem[2] = {1, 1};
          const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, w2, dims, strides, box, elem,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, pr.p,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
          const char* how = scattered ? "scattered" : "slice order";
          if (r != CUDA_SUCCESS) {
            std::printf("| %d | %d | slices | %s | %s | encode failed (%d) | | |\n", cols, depth, pr.name, how, (int)r);
            continue;
          }
          const float ms = median_ms([&] { slices<<<sms, kThreads, smem>>>(map, order_d, tasks, cols, depth); });
          std::printf("| %d | %d | slices | %s | %s | %.3f | %.0f | %.3f |\n", cols, depth, pr.name, how, ms,
                      bytes / ms / 1e6, ms / base);
        }
      }
    }
  }
  return 0;
}

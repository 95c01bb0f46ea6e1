// What does reading W2 by column slices cost in HBM time? (PERF_LOG #166: the fused expert task pays at batch 1-2
// only if a slice's 2048 segments of 2 x C bytes, at W2's 1536-byte row stride, stream at the copy bandwidth of their
// own bytes; if HBM moves whole 128-byte lines, 48-column slices cost a third more and the task gains nothing.)
//
// A W2-shaped tensor, [experts x 2048 rows, 768 columns] bf16 (201 MB: more than L2), is read exactly once per pass,
// one block per SM, each block's producer thread keeping a ring of 5 x 32 KB of copies in flight (the megakernel's
// ring; the data is never read):
//   - contiguous: 32 KB bulk copies of consecutive rows (what the up/gate and down waves stream today);
//   - slices of C columns (C = 32, 48, 64): every (expert, column slice) is a task of 2048 rows, loaded as 2-D TMA
//     boxes of up to 256 rows (one 32 KB stage at most) x C columns through a tensor map, for each L2 promotion
//     the map allows.
//     Tasks are dealt in slice order (an expert's slices on consecutive SMs at about the same time, as the claimed
//     wave hands them out at batch 1), and again in a scattered order (an expert's neighbouring slices far apart in
//     time, so no neighbour's lines are in L2 to share).
// Printed: each mode's time (median of 9 passes after 2 warm-ups, CUDA events) and bandwidth over the tensor's own
// bytes, and its ratio to the contiguous pass.
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

namespace ptx = cuda::ptx;

constexpr int kExperts = 64, kRows = 2048, kCols = 768;  // one MoE layer's W2 is 128 x 2048 x 768; half is past L2
constexpr int kStage = 32768, kRing = 5, kThreads = 32;

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

struct Shared {
  alignas(128) uint8_t buf[kRing][kStage];
  uint64_t full[kRing];
};

// Spins until stage n's copies have landed; traps after 100 ms (no silent hang).
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

// Contiguous: the tensor as kStage-byte chunks, chunk k on block k % gridDim.x.
__global__ void __launch_bounds__(kThreads) contiguous(const uint8_t* src, long long bytes) {
  extern __shared__ __align__(128) uint8_t smem[];
  Shared& s = *reinterpret_cast<Shared*>(smem);
  if (threadIdx.x != 0) return;
  for (int i = 0; i < kRing; ++i) ptx::mbarrier_init(&s.full[i], 1);
  ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
  const uint64_t policy = evict_first();
  uint32_t n = 0;
  for (long long k = blockIdx.x; k * kStage < bytes; k += gridDim.x, ++n) {
    if (n >= kRing) wait_landed(s, n - kRing);
    uint64_t* bar = &s.full[n % kRing];
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, kStage);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
        :
        : "r"((uint32_t)__cvta_generic_to_shared(s.buf[n % kRing])), "l"(src + k * kStage), "r"(kStage),
          "r"((uint32_t)__cvta_generic_to_shared(bar)), "l"(policy)
        : "memory");
  }
  for (uint32_t m = n > kRing ? n - kRing : 0; m < n; ++m) wait_landed(s, m);
}

// Slices: task t = order[t'] for this block's t' = blockIdx.x, + gridDim.x, ...; task t is (expert t / S, slice t % S)
// with S = kCols / C slices an expert; its 2048 rows in boxes of `box_rows`.
__global__ void __launch_bounds__(kThreads) slices(const __grid_constant__ CUtensorMap map, const int* order, int tasks,
                                                   int cols, int box_rows) {
  extern __shared__ __align__(128) uint8_t smem[];
  Shared& s = *reinterpret_cast<Shared*>(smem);
  if (threadIdx.x != 0) return;
  for (int i = 0; i < kRing; ++i) ptx::mbarrier_init(&s.full[i], 1);
  ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
  const int per_expert = kCols / cols;
  const uint32_t box_bytes = (uint32_t)box_rows * cols * 2;
  uint32_t n = 0;
  for (int i = blockIdx.x; i < tasks; i += gridDim.x) {
    const int t = order[i], expert = t / per_expert, c0 = (t % per_expert) * cols;
    for (int r = 0; r < kRows; r += box_rows, ++n) {
      if (n >= kRing) wait_landed(s, n - kRing);
      uint64_t* bar = &s.full[n % kRing];
      ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, box_bytes);
      const int32_t coords[2] = {c0, expert * kRows + r};
      ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, s.buf[n % kRing], &map, coords, bar);
    }
  }
  for (uint32_t m = n > kRing ? n - kRing : 0; m < n; ++m) wait_landed(s, m);
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
  for (int i = 0; i < 11; ++i) {
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaGetLastError());
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int main() {
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

  const float base = median_ms([&] { contiguous<<<sms, kThreads, smem>>>(w2, bytes); });
  std::printf("W2-shaped tensor %.1f MB, %d SMs, ring %d x %d KB\n\n", bytes / 1e6, sms, kRing, kStage / 1024);
  std::printf("| mode | C | L2 promotion | order | ms | GB/s over the tensor's bytes | against contiguous |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::printf("| contiguous 32 KB copies | - | - | - | %.3f | %.0f | 1.000 |\n", base, bytes / base / 1e6);

  const struct { CUtensorMapL2promotion p; const char* name; } promos[] = {
      {CU_TENSOR_MAP_L2_PROMOTION_NONE, "none"}, {CU_TENSOR_MAP_L2_PROMOTION_L2_64B, "64B"},
      {CU_TENSOR_MAP_L2_PROMOTION_L2_128B, "128B"}, {CU_TENSOR_MAP_L2_PROMOTION_L2_256B, "256B"}};
  int* order_d;
  CHECK(cudaMalloc(&order_d, sizeof(int) * kExperts * kCols / 32));
  for (int cols : {32, 48, 64}) {
    const int box_rows = std::min(256, kStage / (cols * 2));  // a box is at most one 32 KB stage, 256 rows at most
    const int tasks = kExperts * (kCols / cols);
    for (int scattered = 0; scattered < 2; ++scattered) {
      std::vector<int> order(tasks);
      for (int i = 0; i < tasks; ++i) order[i] = i;
      if (scattered) {  // an expert's neighbouring slices in different rounds of the grid
        const int per_expert = kCols / cols;
        for (int i = 0; i < tasks; ++i) order[i] = (i % kExperts) * per_expert + i / kExperts;
      }
      CHECK(cudaMemcpy(order_d, order.data(), sizeof(int) * tasks, cudaMemcpyHostToDevice));
      for (const auto& pr : promos) {
        CUtensorMap map;
        const cuuint64_t dims[2] = {(cuuint64_t)kCols, (cuuint64_t)kExperts * kRows};
        const cuuint64_t strides[1] = {(cuuint64_t)kCols * 2};
        const cuuint32_t box[2] = {(cuuint32_t)cols, (cuuint32_t)box_rows};
        const cuuint32_t elem[2] = {1, 1};
        const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, w2, dims, strides, box, elem,
                                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, pr.p,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (r != CUDA_SUCCESS) {
          std::printf("| slices | %d | %s | %s | encode failed (%d) | | |\n", cols, pr.name,
                      scattered ? "scattered" : "slice order", (int)r);
          continue;
        }
        const float ms = median_ms([&] { slices<<<sms, kThreads, smem>>>(map, order_d, tasks, cols, box_rows); });
        std::printf("| slices (%d-row boxes) | %d | %s | %s | %.3f | %.0f | %.3f |\n", box_rows, cols, pr.name,
                    scattered ? "scattered" : "slice order", ms, bytes / ms / 1e6, ms / base);
      }
    }
  }
  return 0;
}

// What the standalone probes in benchmarks/candidates share (each is one .cu file built as its header says, from
// the repository root; tests/cpu/test_probes_compile.py compiles them all): a checked CUDA runtime call and the
// device's nanosecond clock.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

// A CUDA runtime call that must succeed: otherwise the file, line, call and error, and exit 1.
#define CHECK(x)                                                                                  \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// %globaltimer: nanoseconds, the same clock on every SM (the probes time across SMs and bound their waits with it).
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

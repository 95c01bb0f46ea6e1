#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "device_info.cuh"

namespace vllm_megakernel {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("vllm_megakernel: ") + what + ": " + cudaGetErrorName(err) +
                             " (" + cudaGetErrorString(err) + ")");
  }
}

__global__ void arch_probe_kernel(int* out) {
#ifdef __CUDA_ARCH__
  *out = __CUDA_ARCH__;
#endif
}

}  // namespace

DeviceInfo query_device(int device) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  DeviceInfo info;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.max_smem_per_block_optin = static_cast<int>(prop.sharedMemPerBlockOptin);
  info.l2_bytes = prop.l2CacheSize;
  return info;
}

int probe_kernel_arch(int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  int* d_out = nullptr;
  check(cudaMalloc(&d_out, sizeof(int)), "cudaMalloc");
  // -1 survives only if the kernel did not run.
  check(cudaMemset(d_out, 0xff, sizeof(int)), "cudaMemset");
  arch_probe_kernel<<<1, 1>>>(d_out);
  cudaError_t launch = cudaGetLastError();
  int arch = -1;
  cudaError_t copy = cudaMemcpy(&arch, d_out, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d_out);
  check(launch, "launching the sm_90a probe kernel");
  check(copy, "reading the probe kernel's result");
  return arch;
}

}  // namespace vllm_megakernel

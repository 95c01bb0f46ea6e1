// Device facts the host side needs before it builds a schedule (SM count, shared-memory limit), and a
// probe that runs one sm_90a kernel so a build/GPU mismatch shows up as an error, not as a silent no-op.
#pragma once

#include <string>

namespace vllm_megakernel {

struct DeviceInfo {
  std::string name;
  int major = 0;
  int minor = 0;
  int sm_count = 0;
  int max_smem_per_block_optin = 0;  // bytes, after cudaFuncSetAttribute raises the dynamic limit
  int l2_bytes = 0;
};

// Throws std::runtime_error naming the CUDA error when there is no usable device.
DeviceInfo query_device(int device);

// Launches a one-thread kernel on `device` and returns the __CUDA_ARCH__ it was compiled for (900 for
// sm_90a). Throws when the kernel cannot run there (wrong architecture, no device).
int probe_kernel_arch(int device);

}  // namespace vllm_megakernel

// Python binding of the extension. Everything here takes plain integers (device ordinals now; raw device
// pointers and a cudaStream_t for the megakernel launch later), so the module does not link against
// libtorch and builds with pybind11 alone.
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "device_info.cuh"

namespace py = pybind11;
using namespace vllm_megakernel;

#ifndef VLLM_MEGAKERNEL_VERSION
#define VLLM_MEGAKERNEL_VERSION "unknown"
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "vllm_megakernel CUDA extension";

  m.def("build_info", [] {
    py::dict info;
    info["version"] = VLLM_MEGAKERNEL_VERSION;
    info["cuda_arch"] = "sm_90a";
    info["cuda_runtime"] = CUDART_VERSION;
    // Flipped when the persistent decode kernel lands; Python refuses to route decode here until then.
    info["decode_kernel"] = false;
    return info;
  });

  m.def(
      "query_device",
      [](int device) {
        DeviceInfo d = query_device(device);
        py::dict out;
        out["name"] = d.name;
        out["capability"] = py::make_tuple(d.major, d.minor);
        out["sm_count"] = d.sm_count;
        out["max_smem_per_block_optin"] = d.max_smem_per_block_optin;
        out["l2_bytes"] = d.l2_bytes;
        return out;
      },
      py::arg("device") = 0);

  m.def("probe_kernel_arch", &probe_kernel_arch, py::arg("device") = 0);
}

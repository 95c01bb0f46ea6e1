// Python binding of the extension. Everything here takes plain integers (device ordinals now; raw device
// pointers and a cudaStream_t for the megakernel launch later), so the module does not link against
// libtorch and builds with pybind11 alone.
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "abi.h"
#include "device_info.cuh"
#include "megakernel.cuh"

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
    info["abi_version"] = vllm_megakernel::abi::kAbiVersion;
    // vLLM's decode may be routed to launch_decode (Python refuses otherwise).
    info["decode_kernel"] = true;
    info["decode_smem_bytes"] = vllm_megakernel::decode_smem_bytes();
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

  // Raw device addresses from torch tensors' data_ptr(); the stream is torch's current stream handle.
  m.def(
      "launch_decode",
      [](uintptr_t step_table, uintptr_t layer_table, uintptr_t tasks, int max_tasks, int grid, uintptr_t barriers,
         uintptr_t error, uintptr_t stream) {
        LaunchArgs a;
        a.step_table = reinterpret_cast<const long long*>(step_table);
        a.layer_table = reinterpret_cast<const long long*>(layer_table);
        a.tasks = reinterpret_cast<const int*>(tasks);
        a.max_tasks = max_tasks;
        a.grid = grid;
        a.barriers = reinterpret_cast<int*>(barriers);
        a.error = reinterpret_cast<int*>(error);
        launch_decode(a, reinterpret_cast<cudaStream_t>(stream));
      },
      py::arg("step_table"), py::arg("layer_table"), py::arg("tasks"), py::arg("max_tasks"), py::arg("grid"),
      py::arg("barriers"), py::arg("error"), py::arg("stream"));
}

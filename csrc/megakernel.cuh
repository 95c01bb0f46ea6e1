// Host entry point of the decode megakernel.
#pragma once

#include <cuda_runtime.h>

namespace vllm_megakernel {

struct LaunchArgs {
  const long long* step_table;   // device, abi::kStepWords int64
  const long long* layer_table;  // device, [num_layers][abi::kLayerWords] int64
  const int* tasks;              // device, [grid][max_tasks][abi::kTaskWords] int32, END-terminated
  int max_tasks;                 // task slots per SM in `tasks`
  int grid;                      // persistent blocks, one per SM
  int* barriers;                 // device, zeroed before every step
  int* error;                    // device, abi::kErrorWords int32: flag 0, sm -1 before the step
};

// Dynamic shared memory one block of the kernel uses (its rings and the largest opcode's scratch).
size_t decode_smem_bytes();

// Enqueues one decode step on `stream` (no host synchronisation: capturable in a CUDA graph).
void launch_decode(const LaunchArgs& args, cudaStream_t stream);

}  // namespace vllm_megakernel

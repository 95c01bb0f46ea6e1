// The persistent decode megakernel: one block per SM walks its own task list for the whole step.
//
// Warp 0 (controller) copies upcoming descriptors from global memory into a shared ring of kRingSlots
// (ring.cuh) so workers never wait on a descriptor fetch. Warps 1.. (workers) take descriptors in order: one worker
// thread waits on the task's input barriers (bounded, see barrier.cuh), all workers run the opcode body,
// make their writes visible, and one thread signals the task's barrier. Workers join on a named barrier
// that leaves the controller out.
#include <stdexcept>
#include <string>

#include "barrier.cuh"
#include "common.cuh"
#include "megakernel.cuh"
#include "ops/attention.cuh"
#include "ops/dense_ffn.cuh"
#include "ops/moe.cuh"
#include "ops/norm.cuh"
#include "ops/o_proj.cuh"
#include "ops/qkv_rope.cuh"
#include "ops/router.cuh"
#include "ring.cuh"

namespace vllm_megakernel {
namespace {

__device__ void run_task(const Step& st, const long long* layer_table, const int* desc, float* smem) {
  const int op = desc[abi::F_OPCODE];
  const int layer = desc[abi::F_LAYER];
  const Layer ly{layer_table + (long long)layer * abi::kLayerWords};
  switch (op) {
    case abi::OP_EMBED_RMSNORM: op_norm<NormKind::kEmbed>(st, ly.ptr<const bf16>(abi::L_NORM_W)); break;
    case abi::OP_ADD_RMSNORM: op_norm<NormKind::kAdd>(st, ly.ptr<const bf16>(abi::L_NORM_W)); break;
    case abi::OP_FINAL_NORM: op_norm<NormKind::kFinal>(st, st.ptr<const bf16>(abi::S_FINAL_NORM)); break;
    case abi::OP_QKV_ROPE: op_qkv_rope(st, ly, desc, smem); break;
    case abi::OP_ATTN_PARTIAL: op_attn_partial(st, ly, desc); break;
    case abi::OP_ATTN_COMBINE: op_attn_combine(st, desc); break;
    case abi::OP_O_PROJ: op_o_proj(st, ly, desc); break;
    case abi::OP_DENSE_UPGATE: op_dense_upgate(st, ly, desc, smem); break;
    case abi::OP_DENSE_DOWN: op_dense_down(st, ly, desc); break;
    case abi::OP_ROUTER: op_router(st, ly, layer, smem); break;
    case abi::OP_MOE_UPGATE: op_moe_upgate(st, ly, desc, smem); break;
    case abi::OP_MOE_DOWN: op_moe_down(st, ly, desc); break;
    case abi::OP_MOE_COMBINE: op_moe_combine(st, desc); break;
    default: break;  // unknown opcodes are refused by the host encoder
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    decode_kernel(const long long* __restrict__ step_table, const long long* __restrict__ layer_table,
                  const int* __restrict__ tasks, int max_tasks, int* barriers, int* error) {
  __shared__ long long s_step[abi::kStepWords];
  __shared__ DescriptorRing ring;
  // Raised by the worker that saw a dependency wait give up; read by the controller while it waits for a
  // free slot, so it stops instead of waiting for workers that have left.
  __shared__ volatile int s_abort;
  extern __shared__ float smem[];

  for (int i = threadIdx.x; i < abi::kStepWords; i += kThreads) s_step[i] = step_table[i];
  if (threadIdx.x == 0) {
    ring.init();
    s_abort = 0;
  }
  __syncthreads();  // the only full-block barrier: before the roles split

  const int* my_tasks = tasks + (long long)blockIdx.x * max_tasks * abi::kTaskWords;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (warp == 0) {  // controller
    for (int i = 0; i < max_tasks; ++i) {
      const int slot = DescriptorRing::slot(i);
      if (i >= kRingSlots) {  // the slot's previous descriptor (task i - kRingSlots) must have been copied out
        while (!DescriptorRing::test(&ring.empty[slot], DescriptorRing::parity(i - kRingSlots)))
          if (s_abort) return;
      }
      const int word = my_tasks[(long long)i * abi::kTaskWords + lane];
      ring.words[slot][lane] = word;
      DescriptorRing::arrive(&ring.full[slot]);
      if (__shfl_sync(0xffffffffu, word, 0) == abi::OP_END) return;
    }
    return;
  }

  const Step st{s_step};
  const long long timeout_ns = s_step[abi::S_TIMEOUT_NS];
  const bool leader = threadIdx.x == 32;
  long long* const trace = st.ptr<long long>(abi::S_TRACE);  // null unless profiling
  __shared__ int s_desc[abi::kTaskWords];
  for (int i = 0; i < max_tasks; ++i) {
    if (warp == 1) {  // the first worker warp takes the descriptor out of the ring, a word per lane
      const int slot = DescriptorRing::slot(i);
      // No abort check: the controller only ever waits on slots this warp has already freed.
      while (!DescriptorRing::test(&ring.full[slot], DescriptorRing::parity(i))) {
      }
      s_desc[lane] = ring.words[slot][lane];
      DescriptorRing::arrive(&ring.empty[slot]);
    }
    worker_sync();
    if (s_desc[abi::F_OPCODE] == abi::OP_END) return;
    // Read now: after the last worker_sync of this task the first worker warp may already be writing the
    // next descriptor into s_desc.
    const int signal = s_desc[abi::F_SIGNAL_BARRIER];
    const int task_index = s_desc[abi::F_TASK_INDEX];
    unsigned long long wait_start = 0, run_start = 0;
    if (leader) {
      if (trace) wait_start = global_timer_ns();
      const bool ok = wait_barrier(barriers, s_desc[abi::F_WAIT0_BARRIER], s_desc[abi::F_WAIT0_COUNT], error,
                                   timeout_ns, s_desc) &&
                      wait_barrier(barriers, s_desc[abi::F_WAIT1_BARRIER], s_desc[abi::F_WAIT1_COUNT], error,
                                   timeout_ns, s_desc);
      if (!ok) s_abort = 1;
      if (trace) run_start = global_timer_ns();
    }
    worker_sync();
    if (s_abort) return;  // the controller sees s_abort too and stops waiting for free slots
    run_task(st, layer_table, s_desc, smem);
    __threadfence();  // this thread's outputs are visible device-wide before the signal below
    worker_sync();
    if (leader) {
      if (trace) {
        long long* rec = trace + (long long)task_index * abi::kTraceWords;
        rec[abi::T_SM] = blockIdx.x;
        rec[abi::T_WAIT_START_NS] = (long long)wait_start;
        rec[abi::T_RUN_START_NS] = (long long)run_start;
        rec[abi::T_END_NS] = (long long)global_timer_ns();
      }
      arrive_barrier(barriers, signal);
    }
  }
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("vllm_megakernel: ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace

void launch_decode(const LaunchArgs& a, cudaStream_t stream) {
  if (a.grid <= 0 || a.max_tasks <= 0) throw std::invalid_argument("vllm_megakernel: empty task list");
  check(cudaFuncSetAttribute(decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)a.smem_bytes),
        "raising the dynamic shared-memory limit");
  decode_kernel<<<a.grid, kThreads, a.smem_bytes, stream>>>(a.step_table, a.layer_table, a.tasks, a.max_tasks,
                                                           a.barriers, a.error);
  check(cudaGetLastError(), "launching the decode megakernel");
}

}  // namespace vllm_megakernel

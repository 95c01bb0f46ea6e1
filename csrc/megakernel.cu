// The persistent decode megakernel: one block per SM walks its own task list for the whole step.
//
// Roles (roles.cuh): the producer warp fetches this SM's descriptors into the descriptor ring and issues
// each task's weight / K/V loads into the stage ring as soon as there is room -- ahead of the consumers,
// across task boundaries, before the tasks' inputs are ready -- so HBM streams while the consumers wait
// on a dependency or finish the previous task. The consumer warps take descriptors in order: the leader
// waits (bounded) on the task's input barriers, all consumers run the opcode's compute on the staged tiles,
// hand the finished task to the signaller warp, which makes their writes visible device-wide and signals
// the task's barrier while the consumers start the next task.
//
// Op dispatch is the one table below (MEGAKERNEL_OPS); each opcode is a struct in ops/ with its own shared
// scratch and its load / compute phases (task.cuh states the contract).
//
// Aborts: a dependency wait that times out (or sees another SM's error record) raises the block's abort
// flag. The consumers learn of a consumer-side abort after a named barrier (all of them at once); the
// producer, the consumers and the signaller learn of each other's aborts in their ring waits, which is
// where they would otherwise wait forever. The consumer warps give up all at the same ring position, the
// first the producer did not fill before it left (pipeline.cuh), so none is left at a named barrier.
#include <cstddef>
#include <stdexcept>
#include <string>

#include "barrier.cuh"
#include "megakernel.cuh"
#include "ops/attention.cuh"
#include "ops/dense_ffn.cuh"
#include "ops/moe.cuh"
#include "ops/norm.cuh"
#include "ops/o_proj.cuh"
#include "ops/qkv_rope.cuh"
#include "ops/router.cuh"

namespace vllm_megakernel {
namespace {

#define MEGAKERNEL_OPS(X)                                                                                        \
  X(NORM, NormOp)                                                                                                \
  X(QKV_ROPE, QkvRopeOp)                                                                                         \
  X(ROUTER, RouterOp)                                                                                            \
  X(ROUTER_TOPK, RouterTopkOp)                                                                                   \
  X(ATTN_PARTIAL, AttnPartialOp)                                                                                 \
  X(ATTN_COMBINE, AttnCombineOp)                                                                                 \
  X(O_PROJ, OProjOp)                                                                                             \
  X(DENSE_UPGATE, DenseUpgateOp)                                                                                 \
  X(DENSE_DOWN, DenseDownOp)                                                                                     \
  X(MOE_UPGATE, MoeUpgateOp)                                                                                     \
  X(MOE_DOWN, MoeDownOp)                                                                                         \
  X(MOE_COMBINE, MoeCombineOp)

union OpShared {
#define MEGAKERNEL_SHARED(name, T) T::Shared name;
  MEGAKERNEL_OPS(MEGAKERNEL_SHARED)
#undef MEGAKERNEL_SHARED
};

struct SharedStorage {
  PipelineStorage pipe;
  OpShared op;
  LocalRoute local_route;  // the producer warp's alone (local routing, ops/topk.cuh)
  long long step[abi::kStepWords];
  BlockContext ctx;  // right after the step table (Consumer::ctx)
  uint32_t lookahead_complete[kKnownBarriers / 32];  // the look-ahead lane's barriers seen complete (its alone)
};
static_assert(offsetof(SharedStorage, ctx) == offsetof(SharedStorage, step) + sizeof(long long) * abi::kStepWords,
              "the block context follows the step table");

constexpr size_t kMaxSharedBytes = 227 * 1024;  // sm_90's opt-in limit per block
static_assert(sizeof(SharedStorage) <= kMaxSharedBytes, "shared memory: rings + the largest op scratch");

__device__ __forceinline__ bool load_task(int op, Producer& p, const Task& t) {
  switch (op) {
#define MEGAKERNEL_LOAD(name, T) \
  case abi::OP_##name:           \
    return T::load(p, t);
    MEGAKERNEL_OPS(MEGAKERNEL_LOAD)
#undef MEGAKERNEL_LOAD
    default:
      return true;  // unknown opcodes are refused by the host encoder
  }
}

#define MEGAKERNEL_HOOK_CHECK(name, T)                                                     \
  static_assert(DeclaresHasWork<T>::value == abi::waits_only_if_work(abi::OP_##name), #T \
                ": declares has_work() exactly when abi.WAITS_ONLY_IF_WORK lists its opcode");
MEGAKERNEL_OPS(MEGAKERNEL_HOOK_CHECK)
#undef MEGAKERNEL_HOOK_CHECK

__device__ __forceinline__ bool has_work(int op, const Step& st, const Task& t) {
  switch (op) {
#define MEGAKERNEL_HAS_WORK(name, T) \
  case abi::OP_##name:               \
    return op_has_work<T>(st, t);
    MEGAKERNEL_OPS(MEGAKERNEL_HAS_WORK)
#undef MEGAKERNEL_HAS_WORK
    default:
      return true;
  }
}

// Whether the loop waits on the task's input barriers. Not for a task with nothing to do on this step's data,
// which reads nothing: no one waits (and holds up the tasks queued behind it on this SM) for inputs it will not
// read. Nor for the top-k when its body polls its inputs' own words instead (RouterTopkOp::polls_inputs;
// schedule.py's Task.polls_inputs).
__device__ __forceinline__ bool reads_inputs(int op, const Step& st, const Task& t) {
  if (op == abi::OP_ROUTER_TOPK && RouterTopkOp::polls_inputs(st)) return false;
  return !abi::waits_only_if_work(op) || has_work(op, st, t);
}

__device__ __forceinline__ bool compute_task(int op, Consumer& c, const Task& t, OpShared& sh) {
  switch (op) {
#define MEGAKERNEL_COMPUTE(name, T) \
  case abi::OP_##name:              \
    return T::compute(c, t, sh.name);
    MEGAKERNEL_OPS(MEGAKERNEL_COMPUTE)
#undef MEGAKERNEL_COMPUTE
    default:
      return true;
  }
}

__device__ Layer layer_of(const long long* layer_table, const int* desc) {
  return Layer{layer_table + (long long)desc[abi::F_LAYER] * abi::kLayerWords};
}

// The step's o_prefetch (StepShape.o_prefetch), called by the whole producer warp when it first reaches one of
// `layer`'s routed places. Its expert rows are not known before the layer's routing, so on every SM that gets
// there early the producer waits and HBM has nothing of the SM's to fetch (at batch 1 the waiting stretch was
// ~5 us a layer, PERF_LOG #162). The SM's O projection places of the layer come later in its list, behind the
// expert places in the ring, but their weights depend on nothing this step computes: L2 is asked for them now,
// and their copies later read L2 instead of adding to the expert stream's HBM bytes. Each lane reads one later
// place's words from the list (32 places a round trip) until a place of a later layer or the list's end.
__device__ __forceinline__ void prefetch_o_rows_ahead(const int* my_tasks, int from, int max_tasks, int layer,
                                                      const Layer& ly) {
  for (int f = from; f < max_tasks; f += 32) {
    const int place = f + Role::lane();
    int op = abi::OP_END, at = layer, row0 = 0, rows = 0;
    if (place < max_tasks) {
      const int* d = my_tasks + (long long)place * abi::kTaskWords;
      op = d[abi::F_OPCODE];
      at = d[abi::F_LAYER];
      row0 = d[abi::F_O_PROJ_ROW0];  // an O_PROJ place's; read from every place, used only from those
      rows = d[abi::F_O_PROJ_ROWS];
    }
    if (op == abi::OP_O_PROJ && at == layer) OProjOp::prefetch(ly, row0, rows);
    if (__any_sync(0xffffffffu, op == abi::OP_END || at > layer)) return;  // lists are in step (layer) order
  }
}

// The producer warp's walk of the SM's list; leaves at the end of the list or on an abort, with `i` the
// descriptors it published (the stages it filled are p.stages.n on lane 0).
__device__ __forceinline__ void produce(SharedStorage& S, Producer& p, int& i, const long long* layer_table,
                                        const int* my_tasks, int max_tasks) {
  PipelineStorage& pipe = S.pipe;
  const int lane = Role::lane();
  int next = my_tasks[lane];  // descriptors are fetched one ahead: the load is in flight while we wait
  RoutingSeen seen;           // the routing as far as this producer has waited for it (ops/moe.cuh)
  // e walks the SM's list; i counts the ring positions published, which fall behind e by the expert tasks
  // skipped (a dead slot's task is not published: the consumers and the signaller see the list without
  // it, ending at OP_END).
  for (int e = 0; e < max_tasks; ++e) {
    int word = next;
    if (e + 1 < max_tasks) next = my_tasks[(long long)(e + 1) * abi::kTaskWords + lane];
    int op = __shfl_sync(0xffffffffu, word, 0);
    if (skipped_unclaimed(op, word, seen)) {  // no ring position, no wait for one: on to the next live place
      e = min(first_unskipped(my_tasks, e + 1, max_tasks, seen), max_tasks - 1);  // the last row: END, never skipped
      word = my_tasks[(long long)e * abi::kTaskWords + lane];
      if (e + 1 < max_tasks) next = my_tasks[(long long)(e + 1) * abi::kTaskWords + lane];
      op = __shfl_sync(0xffffffffu, word, 0);
    }
    if (abi::routed_descriptor(op) && p.st.i(abi::S_O_PREFETCH)) {  // (the step table's word, not a register
                                                                    // held across the walk: the producer's 72 spill)
      const int layer = __shfl_sync(0xffffffffu, word, abi::F_LAYER);
      if (layer != seen.layer)  // the layer's first routed place here: its routing not waited for yet
        prefetch_o_rows_ahead(my_tasks, e + 1, max_tasks, layer,
                              Layer{layer_table + (long long)layer * abi::kLayerWords});
    }
    const int slot = i % kDescSlots;
    // Every lane waits; they leave together if any saw the abort, before any of them counts or fills the
    // position (the count published for the consumers must hold only descriptors all 32 lanes arrive on).
    if (!__all_sync(0xffffffffu, pipe.wait(&pipe.desc_empty[slot], ((i / kDescSlots) & 1) ^ 1))) return;
    // An expert task's descriptor is finished here, before the consumers see it: which tile it runs (a
    // claim, taken when the producer reaches the place) and the slot's routing (ops/moe.cuh). This waits
    // for the layer's routing, which the task's loads need anyway.
    if (abi::routed_descriptor(op)) {
      const Layer ly{layer_table + (long long)__shfl_sync(0xffffffffu, word, abi::F_LAYER) * abi::kLayerWords};
      const Routed r = complete_routed_descriptor(p, S.local_route, pipe.desc[slot], ly, op, word, seen);
      if (r == Routed::kAbort) return;
      if (r == Routed::kDead) continue;  // ring position i stays free for the next place
    }
    ++i;
    pipe.desc[slot][lane] = word;
    ptx::mbarrier_arrive(&pipe.desc_full[slot]);  // release: the consumers see the word once the phase completes
    if (op == abi::OP_END) return;
    __syncwarp();  // lane 0 reads the other lanes' words below
    int ok = 1;
    if (lane == 0) ok = load_task(op, p, Task{pipe.desc[slot], layer_of(layer_table, pipe.desc[slot])});
    if (!__shfl_sync(0xffffffffu, ok, 0)) return;
  }
}

__device__ __forceinline__ void run_producer(SharedStorage& S, const Step& st, const long long* layer_table,
                                             const int* my_tasks, int max_tasks, int* barriers, int* error) {
  // The host checks stages_in_flight against the ring (schedule.StepShape); clamped here all the same, since
  // 0 would let no stage issue and the consumers would wait out their timeout.
  const uint32_t in_flight = (uint32_t)min(max(st.i(abi::S_STAGES_IN_FLIGHT), 1LL), (long long)kStages);
  Producer p{st, StageProducer{S.pipe, in_flight}, barriers, error, st.i(abi::S_TIMEOUT_NS)};
  int published = 0;
  produce(S, p, published, layer_table, my_tasks, max_tasks);
  // Every descriptor counted was stored and arrived on by all 32 lanes before produce() could return, and
  // every stage counted had its copies issued: the consumers may wait out any position below these.
  __syncwarp();
  if (Role::lane() != 0) return;
  S.pipe.publish_filled(p.stages.n, (uint32_t)published);
  // On an abort, now or after this warp left, the consumers may leave with stages still in flight (a
  // consumer-side abort leaves from a named barrier, not from the ring); a block must not exit while bulk
  // copies write its shared memory, so the producer stays until its last stages (at most the ring's depth
  // of them) have landed. Without an abort the consumers wait for them anyway: this costs the step nothing.
  for (uint32_t q = p.stages.n > (uint32_t)kStages ? p.stages.n - kStages : 0; q < p.stages.n; ++q)
    while (!ptx::mbarrier_try_wait_parity(&S.pipe.full[q % kStages], (q / kStages) & 1)) {
    }
}

__device__ __forceinline__ void run_consumers(SharedStorage& S, const Step& st, const long long* layer_table,
                                              int max_tasks, int* barriers, int* error) {
  PipelineStorage& pipe = S.pipe;
  long long* const trace = st.ptr<long long>(abi::S_TRACE);  // null unless profiling
  Consumer c{st, StageConsumer{pipe}, Role::consumer_warp(), Role::lane(), Role::consumer_thread(), trace != nullptr};
  const bool leader = Role::consumer_leader();
  const long long timeout_ns = st.i(abi::S_TIMEOUT_NS);
  for (int i = 0; i < max_tasks; ++i) {
    const int slot = i % kDescSlots;
    if (!pipe.wait_filled(&pipe.desc_full[slot], (i / kDescSlots) & 1, &pipe.filled_descs, (uint32_t)i)) return;
    const int* d = pipe.desc[slot];
    const int op = d[abi::F_OPCODE];
    if (op == abi::OP_END) return;
    const Task t{d, layer_of(layer_table, d)};
    if (leader) {
      if (trace) S.ctx.wait_start_ns = global_timer_ns();
      // A task whose inputs the look-ahead lane already saw complete needs no round trip to L2: its arrival
      // (release, CTA scope) after its acquire loads and this test (acquire, CTA scope) order the inputs
      // before the consumers' reads.
      const bool ok =
          !reads_inputs(op, st, t) ||
          ptx::mbarrier_test_wait_parity(&pipe.inputs_seen[slot], (i / kDescSlots) & 1) ||
          wait_task_inputs(S.ctx.complete, barriers, error, timeout_ns, d);
      if (!ok) c.abort();  // and the producer stops waiting for ring space
      if (trace) S.ctx.run_start_ns = global_timer_ns();
    }
    consumer_sync();
    if (S.ctx.consumer_abort) return;
    if (!compute_task(op, c, t, S.op)) return;
    // Every consumer's writes are ordered before the leader's arrival on done[slot] by this named barrier,
    // and that arrival (release, CTA scope) before the signaller's fence; the same pattern as a grid
    // barrier's one fencing thread after a block barrier.
    consumer_sync();
    if (leader) {
      if (trace) {
        long long* rec = trace + (long long)d[abi::F_TASK_INDEX] * abi::kTraceWords;
        rec[abi::T_SM] = blockIdx.x;
        rec[abi::T_WAIT_START_NS] = (long long)S.ctx.wait_start_ns;
        rec[abi::T_RUN_START_NS] = (long long)S.ctx.run_start_ns;
        rec[abi::T_INPUTS_NS] = (long long)c.inputs_ns;
        rec[abi::T_STAGES_NS] = (long long)c.stages_ns;
        rec[abi::T_COMPUTE_END_NS] = (long long)global_timer_ns();
        rec[abi::T_SMID] = (long long)cuda::ptx::get_sreg_smid();
        c.inputs_ns = c.stages_ns = 0;
      }
      ptx::mbarrier_arrive(&pipe.done[slot]);
    }
    ptx::mbarrier_arrive(&pipe.desc_empty[slot]);  // this lane is done with the descriptor's words
  }
}

// Whether the look-ahead lane has seen `barrier` reach `count`: relaxed polls (no L1 invalidation on each, as an
// acquire load has), then one acquire load once the count is there, which synchronizes with every signaller as
// the leader's wait does (barrier.cuh). `known` caches barriers seen complete (they stay so within a step).
__device__ __forceinline__ bool lookahead_reached(uint32_t* known, int* barriers, int barrier, int count) {
  if (barrier == abi::kNoBarrier) return true;
  return known_or_reached(known, barrier, [&] {
    cuda::atomic_ref<int, cuda::thread_scope_device> ctr(barriers[barrier]);
    return ctr.load(cuda::memory_order_relaxed) >= count && ctr.load(cuda::memory_order_acquire) >= count;
  });
}

// Lane 0 of the look-ahead warp: each task, in order, as soon as the producer publishes it (ahead of the
// consumers wherever they are still busy with earlier tasks): polls its input barriers until they complete and
// then arrives on inputs_seen[slot], so that the consumer leader, when it gets to the task, tests that
// mbarrier in shared memory instead of paying its own round trip to L2 for inputs that were long done (a
// check that found its inputs done cost the leader 0.2-0.5 us a task: session AE's profile). It gives up on a
// task once the consumers finished it (their own wait saw the inputs), and leaves on an abort, at the end of
// the list, or at the end marker. It never holds anyone up: the consumers do not wait for it, and it arrives on
// desc_empty[slot] at the latest when it sees the consumers' done[slot].
__device__ __forceinline__ void run_lookahead(SharedStorage& S, const Step& st, const long long* layer_table,
                                              int max_tasks, int* barriers) {
  PipelineStorage& pipe = S.pipe;
  for (int i = 0; i < max_tasks; ++i) {
    const int slot = i % kDescSlots;
    const uint32_t parity = (i / kDescSlots) & 1;
    if (!pipe.wait(&pipe.desc_full[slot], parity)) return;
    const int* d = pipe.desc[slot];
    const int op = d[abi::F_OPCODE];
    if (op == abi::OP_END) return;
    // what the leader would wait for, read before the arrival on desc_empty lets the producer rewrite the words
    const int b0 = d[abi::F_WAIT0_BARRIER], c0 = d[abi::F_WAIT0_COUNT];
    const int b1 = d[abi::F_WAIT1_BARRIER], c1 = d[abi::F_WAIT1_COUNT];
    if (reads_inputs(op, st, Task{d, layer_of(layer_table, d)})) {
      while (!(lookahead_reached(S.lookahead_complete, barriers, b0, c0) &&
               lookahead_reached(S.lookahead_complete, barriers, b1, c1)) &&
             !ptx::mbarrier_test_wait_parity(&pipe.done[slot], parity)) {
        if (pipe.abort) return;
        __nanosleep(20);
      }
    }
    ptx::mbarrier_arrive(&pipe.inputs_seen[slot]);  // release: the acquire loads above before the leader's test
    // The arrival above completed the phase (count 1). The leader tests it only when it gets to a task that reads
    // inputs before that task finished, so many phases would complete with no thread waiting on them, which
    // compute-sanitizer's synccheck reports at the slot's next arrival ("Missing wait"). This lane waits on its own
    // phase instead: one test of shared memory that passes at once.
    if (!pipe.wait(&pipe.inputs_seen[slot], parity)) return;
    ptx::mbarrier_arrive(&pipe.desc_empty[slot]);
  }
}

// Lane 0 of the signaller warp: each task, in order, once the consumers are done with it: fence, then
// signal. Leaves at the end of the list, or when the block aborted (its waits see the flag).
__device__ __forceinline__ void run_signaller(SharedStorage& S, const Step& st, int max_tasks, int* barriers) {
  PipelineStorage& pipe = S.pipe;
  long long* const trace = st.ptr<long long>(abi::S_TRACE);
  for (int i = 0; i < max_tasks; ++i) {
    const int slot = i % kDescSlots;
    const uint32_t parity = (i / kDescSlots) & 1;
    if (!pipe.wait(&pipe.desc_full[slot], parity)) return;
    const int* d = pipe.desc[slot];
    if (d[abi::F_OPCODE] == abi::OP_END) return;
    if (!pipe.wait(&pipe.done[slot], parity)) return;
    release_fence();  // the consumers' outputs are visible device-wide before the signal below
    if (trace) trace[(long long)d[abi::F_TASK_INDEX] * abi::kTraceWords + abi::T_END_NS] = (long long)global_timer_ns();
    arrive_barrier(barriers, d[abi::F_SIGNAL_BARRIER]);
    // The top-k also signals, for every dead slot, the down-wave tiles the producers will skip (abi.py's
    // routed descriptors): the wait on that barrier (the MoE combine's, or the next NORM's with
    // combine_in_norm) counts every tile of every slot. The
    // routed count is this task's own output (the consumers' done arrival ordered it before this read). Read
    // after the routing's signal above, so that its round trip to L2 does not delay the expert tasks.
    if (d[abi::F_OPCODE] == abi::OP_ROUTER_TOPK) {
      const int dead = (int)st.i(abi::S_NUM_SLOTS) - st.layer_active()[d[abi::F_LAYER]];
      if (dead > 0) arrive_barrier(barriers, d[abi::F_ROUTER_TOPK_DOWN_BARRIER], dead * d[abi::F_ROUTER_TOPK_DOWN_TILES]);
    }
    ptx::mbarrier_arrive(&pipe.desc_empty[slot]);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    decode_kernel(const long long* __restrict__ step_table, const long long* __restrict__ layer_table,
                  const int* __restrict__ tasks, int max_tasks, int* barriers, int* error) {
  extern __shared__ __align__(128) uint8_t smem[];
  SharedStorage& S = *reinterpret_cast<SharedStorage*>(smem);
  for (int i = threadIdx.x; i < abi::kStepWords; i += kThreads) S.step[i] = step_table[i];
  for (int i = threadIdx.x; i < kKnownBarriers / 32; i += kThreads) S.ctx.complete[i] = S.lookahead_complete[i] = 0;
  if (threadIdx.x == 0) {
    S.pipe.init();
    S.ctx.pipe_abort = &S.pipe.abort;
    S.ctx.error = error;
    S.ctx.consumer_abort = 0;
  }
  __syncthreads();  // the only block-wide barrier: before the roles split
  const Step st{S.step};
  if (Role::consumer()) {
    raise_registers<kConsumerRegisters>();
    run_consumers(S, st, layer_table, max_tasks, barriers, error);
    return;
  }
  lower_registers<kSupportRegisters>();
  if (Role::producer())
    run_producer(S, st, layer_table, tasks + (long long)blockIdx.x * max_tasks * abi::kTaskWords, max_tasks,
                 barriers, error);
  else if (Role::signaller() && Role::lane() == 0)
    run_signaller(S, st, max_tasks, barriers);
  else if (Role::lookahead() && Role::lane() == 0)
    run_lookahead(S, st, layer_table, max_tasks, barriers);
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("vllm_megakernel: ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace

size_t decode_smem_bytes() { return sizeof(SharedStorage); }

void launch_decode(const LaunchArgs& a, cudaStream_t stream) {
  if (a.grid <= 0 || a.max_tasks <= 0) throw std::invalid_argument("vllm_megakernel: empty task list");
  const size_t smem = decode_smem_bytes();
  cudaFuncAttributes attr{};
  check(cudaFuncGetAttributes(&attr, decode_kernel), "reading the decode kernel's attributes");
  // The consumers' setmaxnreg raise waits until the block's pool can cover it: compiled for fewer registers
  // than roles.cuh budgets for, every block would wait forever instead of running.
  if (attr.numRegs < kLaunchRegisters)
    throw std::runtime_error("vllm_megakernel: the decode kernel was compiled for " + std::to_string(attr.numRegs) +
                             " registers a thread; roles.cuh's register budgets need " +
                             std::to_string(kLaunchRegisters));
  check(cudaFuncSetAttribute(decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
        "raising the dynamic shared-memory limit");
  decode_kernel<<<a.grid, kThreads, smem, stream>>>(a.step_table, a.layer_table, a.tasks, a.max_tasks, a.barriers,
                                                    a.error);
  check(cudaGetLastError(), "launching the decode megakernel");
}

}  // namespace vllm_megakernel

"""One megakernel decode step on small shapes, for compute-sanitizer (memcheck / racecheck / synccheck).

    compute-sanitizer --tool memcheck python tests/gpu/sanitize_step.py CHECKPOINT_DIR [--lengths 4500,7,0]
        [--splits 4] [--through WAVE]

--lengths: each batch row's history before the new token, 0 for a padding row (default 4500,7,0: above and
below the sliding window, and a padding row). racecheck instruments every shared-memory access, so short
histories make a step it finishes sooner (the weights' bytes stay). --through WAVE runs the step only up to
the end of layer 0's wave WAVE (Schedule.truncated: a prefix of the task numbering keeps every input of
every kept task), e.g. `mlp_up`: the QKV, attention and dense up/gate tasks, ~47 MB through the stage rings
against ~190 MB for a 2-layer step; the step's output is then not written, so only the run is checked.
--splits: attention splits per request (default 4; 0: the kernel's default for the batch, which a step with
long histories needs so that no one task walks a 128K history under the sanitizer).
"""

import argparse

import torch

from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel import runtime
from vllm_megakernel.megakernel.schedule import StepShape, build_schedule
from vllm_megakernel.paged_kv import PagedKVSim


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--lengths", default="4500,7,0")
    ap.add_argument("--splits", type=int, default=4, help="attention splits per request (0: the batch's default)")
    ap.add_argument("--through", default=None, help="run up to the end of layer 0's wave of this name")
    ap.add_argument("--local-routing", action="store_true",
                    help="the expert tasks' producers route the layer themselves (StepShape.local_routing)")
    ap.add_argument("--posted-routing", action="store_true",
                    help="the top-k posts its work list and the expert tasks' producers poll it (StepShape.posted_routing)")
    ap.add_argument("--barrier-routing", action="store_true",
                    help="the expert tasks wait on the top-k's barrier and read the route buffer, where the batch's "
                         "default is posted routing (StepShape.posted_routing=False)")
    ap.add_argument("--posted-scores", action="store_true",
                    help="the routers post their scores as keys and the top-k polls them (StepShape.posted_scores)")
    ap.add_argument("--stages-in-flight", type=int, default=0,
                    help="the producer's cap on stages in flight (StepShape.stages_in_flight; 0: the batch's default)")
    args = ap.parse_args(argv)
    if args.barrier_routing and (args.posted_routing or args.posted_scores):
        raise SystemExit("--barrier-routing: not with --posted-routing or --posted-scores")
    return args


def step_shape(args: argparse.Namespace, batch: int, num_sms: int) -> StepShape:
    """The step's schedule choices from the command line; what is left out takes the batch's default."""
    return StepShape(batch=batch, num_sms=num_sms, attn_splits=args.splits, local_routing=args.local_routing or None,
                     posted_routing=False if args.barrier_routing else args.posted_routing or None,
                     posted_scores=args.posted_scores or None, stages_in_flight=args.stages_in_flight)


def main():
    args = parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    if not lengths or min(lengths) < 0 or not any(lengths):
        raise SystemExit(f"--lengths {args.lengths}: histories >= 0 (0: padding), at least one live row")
    ckpt = args.checkpoint
    dims = ref.ModelDims.from_config(ckpt)
    w = ref.Weights.from_checkpoint(ckpt, dims, dtype=torch.bfloat16).to("cuda")
    batch = len(lengths)
    live = [n for n in lengths if n]  # PagedKVSim's requests: the live rows first, padding rows last
    if lengths != live + [0] * (batch - len(live)):
        raise SystemExit("--lengths: padding rows (0) go last")
    sim = PagedKVSim(dims, num_requests=batch, max_len=max(live) + 1, block_size=16, dtype=torch.bfloat16, device="cuda")
    sim.fill_history(live, generator=torch.Generator().manual_seed(0))
    inp = sim.step([11 + i for i in range(len(live))] + [None] * (batch - len(live)))
    sched = build_schedule(dims, step_shape(args, batch, torch.cuda.get_device_properties(0).multi_processor_count),
                           *w.intermediates())
    if args.through:
        sched = sched.truncated(sched.wave_range(0, args.through)[1])
    # Under the sanitizer every access is instrumented, so a barrier wait can take far longer than the 5 s
    # production timeout without anything being wrong.
    out = runtime.run_step(runtime.build_step(sched, w, inp, timeout_s=600.0))
    torch.cuda.synchronize()
    if args.through:  # the launch returned without a kernel error; the step's output is not written
        print(f"step ok (through layer 0's {args.through}, {len(sched.tasks)} tasks)")
        return
    assert torch.isfinite(out[:len(live)]).all()
    print("step ok")


if __name__ == "__main__":
    main()

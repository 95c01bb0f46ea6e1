"""One megakernel decode step on small shapes, for compute-sanitizer (memcheck / racecheck / synccheck).

    compute-sanitizer --tool memcheck python tests/gpu/sanitize_step.py CHECKPOINT_DIR
"""

import sys

import torch

from vllm_megakernel import reference as ref
from vllm_megakernel.megakernel import runtime
from vllm_megakernel.megakernel.schedule import StepShape, build_schedule
from vllm_megakernel.paged_kv import PagedKVSim


def main():
    ckpt = sys.argv[1]
    dims = ref.ModelDims.from_config(ckpt)
    w = ref.Weights.from_checkpoint(ckpt, dims, dtype=torch.bfloat16).to("cuda")
    batch = 3
    sim = PagedKVSim(dims, num_requests=batch, max_len=5000, block_size=16, dtype=torch.bfloat16, device="cuda")
    sim.fill_history([4500, 7], generator=torch.Generator().manual_seed(0))
    inp = sim.step([11, 12, None])
    sched = build_schedule(dims, StepShape(batch=batch, num_sms=torch.cuda.get_device_properties(0).multi_processor_count,
                                           attn_splits=4), *w.intermediates())
    # Under the sanitizer every access is instrumented, so a barrier wait can take far longer than the 5 s
    # production timeout without anything being wrong.
    out = runtime.run_step(runtime.build_step(sched, w, inp, timeout_s=600.0))
    torch.cuda.synchronize()
    assert torch.isfinite(out[:2]).all()
    print("step ok")


if __name__ == "__main__":
    main()

"""A stall inside a replayed FULL CUDA graph of a batch size Python did not launch last (run by
test_stall_reporting_in_vllm.py in a fresh process; prints a JSON line after each stage).

vLLM captures the decode graphs largest first and then replays them without running Python, so the step the
decoder launched last is batch 1's. This corrupts batch 8's step in place (one task's wait count one above its
barrier's target, the timeout cut to 0.2 s): the replayed graph reads the same device tables, stalls, and the
decoder must poison that step's logits and raise a MegakernelStallError naming batch 8's task.

Which stuck task reports first is a race: every wait times out 0.2 s after it began, and a task downstream of
the victim (the next layer's QKV, which waits on the victim's signal) may begin waiting a few microseconds
before the victim does (megakernel.timing puts them within ~3 us of each other at batch 8, either way round).
So the script lists every task the victim holds up (:func:`held_up_by`) and the test accepts any of them.
"""

import json
import os
import sys


def corrupt_batch_8(model):
    import torch

    from vllm_megakernel.megakernel import abi

    with torch.inference_mode():  # vLLM built the tables under inference mode: only there may they change in place
        return _corrupt(model.megakernel, abi)


def pick_victim(schedule):
    return next(t for t in schedule.tasks if t.layer == 1 and t.op.name == "O_PROJ" and t.waits)


def held_up_by(schedule, victim: int) -> set[int]:
    """The tasks that cannot finish while ``victim`` waits forever: the victim, every task that waits (itself or
    through its producer's load wait) on a barrier a held-up task signals, and every task after a held-up one
    in an SM's list (a claimed expert tile may run elsewhere: counted as held up, which only widens the set)."""
    from vllm_megakernel.megakernel.abi import NO_BARRIER

    held, barriers = set(), set()
    todo = [victim]
    after = {i: lst[k + 1:] for lst in schedule.sm_tasks for k, i in enumerate(lst)}
    waiters: dict[int, list[int]] = {}
    for t in schedule.tasks:
        for b in (*t.waits, t.load_wait):
            if b != NO_BARRIER:
                waiters.setdefault(b, []).append(t.index)
    while todo:
        i = todo.pop()
        if i in held:
            continue
        held.add(i)
        todo += after.get(i, [])
        b = schedule.tasks[i].signal
        if b != NO_BARRIER and b not in barriers:
            barriers.add(b)
            todo += waiters.get(b, [])
    return held


def _corrupt(mk, abi):
    last = mk.last.schedule.shape.batch
    step = mk.entries[8].step
    s = step.schedule
    victim = pick_victim(s)
    k = s.sm_tasks[victim.sm].index(victim.index)
    step.tasks[victim.sm, k, abi.field_index(victim.op, "wait0_count")] += 1  # never reached
    step.step_table[abi.STEP_FIELDS.index("timeout_ns")] = 200_000_000
    return {"last_launched_batch": last, "victim": victim.index, "held_up": sorted(held_up_by(s, victim.index)),
            "built": sorted(mk.entries)}


def main():
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=sys.argv[1], additional_config={"megakernel": {"enabled": True, "strict": True}},
              max_model_len=1024, max_num_seqs=8, gpu_memory_utilization=0.5, enable_prefix_caching=False,
              compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}, seed=0)
    result = llm.apply_model(corrupt_batch_8)[0]
    print(json.dumps({"stage": "corrupted", **result}), flush=True)
    prompts = [TokensPrompt(prompt_token_ids=[100 + i] * 64) for i in range(8)]
    try:
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
        result["raised"] = None
    except Exception as e:  # the engine's error, whatever vLLM wraps it in
        result["raised"] = f"{type(e).__name__}: {e}"
    print(json.dumps({**result, "stage": "generated"}), flush=True)
    os._exit(0)  # the engine is dead: do not wait for its shutdown


if __name__ == "__main__":
    main()

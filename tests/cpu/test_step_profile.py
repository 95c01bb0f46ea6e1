"""benchmarks.step_profile's reading of a torch profiler trace (the GPU run is the tool itself)."""

import json

import pytest

from benchmarks import step_profile


def _trace(events):
    return {"traceEvents": events + [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 999},
                                     {"ph": "i", "cat": "kernel", "name": "marker", "ts": 5}]}


def test_gpu_time_is_summed_per_kernel_and_per_step():
    """Per kernel: calls, time per call and per step; busy = the sum of GPU events, span = first start to
    last end; CPU ops and instant events are not GPU time."""
    events = [{"ph": "X", "cat": "kernel", "name": "decode_kernel", "ts": 100 + 1000 * i, "dur": 800} for i in range(4)]
    events += [{"ph": "X", "cat": "kernel", "name": "gemm_lm_head", "ts": 900 + 1000 * i, "dur": 90} for i in range(4)]
    events += [{"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 95 + 1000 * i, "dur": 2}
               for i in range(4)]
    got = step_profile.summarize(step_profile.gpu_events(_trace(events)), steps=4)
    assert [r["name"] for r in got["kernels"]] == ["decode_kernel", "gemm_lm_head", "Memset (Device)"]
    assert got["kernels"][0] == {"name": "decode_kernel", "calls": 4, "us_per_call": 800.0, "us_per_step": 800.0}
    assert got["busy_us_per_step"] == pytest.approx(892.0)
    assert got["span_us_per_step"] == pytest.approx((3990 - 95) / 4)


def test_kernels_past_the_row_limit_fold_into_one_row_and_nothing_is_lost():
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": i * 10, "dur": 10 - i} for i in range(6)]
    got = step_profile.summarize(events, steps=2, rows=3)
    assert [r["name"] for r in got["kernels"]] == ["k0", "k1", "k2", "other (3 kernels)"]
    assert sum(r["us_per_step"] for r in got["kernels"]) == pytest.approx(got["busy_us_per_step"])


def test_an_empty_trace_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="no GPU events"):
        step_profile.summarize(step_profile.gpu_events(_trace([])), steps=4)


def test_the_trace_is_found_only_when_there_is_exactly_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="expected one"):
        step_profile.find_trace(tmp_path)
    (tmp_path / "w.1.pt.trace.json").write_text("{}")
    assert step_profile.find_trace(tmp_path).name == "w.1.pt.trace.json"
    (tmp_path / "w.2.pt.trace.json").write_text("{}")
    with pytest.raises(FileNotFoundError):
        step_profile.find_trace(tmp_path)


def test_the_table_shows_each_side_and_says_when_one_did_not_run():
    events = [{"ph": "X", "cat": "kernel", "name": "a|b", "ts": 0, "dur": 50}]
    result = {"batch": 8, "context": 8192, "steps": 1, "sides": {
        "stock": {"error": "the stock worker exited 1; see its output above"},
        "megakernel": {"wall_ms_per_step": 8.8, "decision": "runs on the megakernel",
                       "profile": step_profile.summarize(events, steps=1)}}}
    text = step_profile.markdown(result)
    assert "## stock" in text and "did not run: the stock worker exited 1" in text
    assert "step wall time without the profiler: 8.800 ms" in text and "| a\\|b | 1 | 50.0 | 50.0 |" in text
    json.dumps(result)  # what profile.json holds

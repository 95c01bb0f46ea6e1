"""The sanitizer's cases (tests/gpu/test_sanitizer.py) each run a step no other case runs: each case is read by
sanitize_step.py's own parser into the schedule choices it launches with, defaults resolved for its batch, so a
case whose flag becomes a batch's default (as posted scores did at batch 1) fails here instead of costing a GPU
session three more sanitizer runs of a step already covered."""

import importlib.util
import sys
from pathlib import Path

import pytest

GPU_TESTS = Path(__file__).resolve().parent.parent / "gpu"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_sanitizer_cases_{name}", GPU_TESTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cases():
    return _load("test_sanitizer").CASES


@pytest.fixture(scope="module")
def sanitize_step():
    return _load("sanitize_step")


def _resolved(sanitize_step, lengths, splits, extra, num_sms=132):
    args = sanitize_step.parse_args(["CHECKPOINT", "--lengths", lengths, "--splits", str(splits), *extra])
    batch = len(lengths.split(","))
    return lengths, sanitize_step.step_shape(args, batch, num_sms)


def test_no_two_sanitizer_cases_run_the_same_step(cases, sanitize_step):
    seen = {}
    for name, (lengths, splits, extra) in cases.items():
        key = _resolved(sanitize_step, lengths, splits, extra)
        assert key not in seen, f"sanitizer cases {seen[key]!r} and {name!r} run the same step: {key[1]}"
        seen[key] = name


def test_a_flag_that_is_the_batch_default_resolves_to_the_default_step(sanitize_step):
    # the check above can fail: at batch 1 posted scores are the default, so asking for them changes nothing
    assert (_resolved(sanitize_step, "4500", 4, ["--posted-scores"])
            == _resolved(sanitize_step, "4500", 4, []))
    assert (_resolved(sanitize_step, "4500,7,0", 4, ["--barrier-routing"])
            != _resolved(sanitize_step, "4500,7,0", 4, []))

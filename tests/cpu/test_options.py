"""The A/B switch: parsing, bad input, and which setups fall back to stock (or raise with strict)."""

from types import SimpleNamespace

import pytest

from vllm_megakernel.options import (
    MegakernelOptionError,
    MegakernelOptions,
    MegakernelUnavailableError,
    MegakernelUnsupportedError,
    decide,
    parse_options,
    unsupported_setup_reasons,
)


@pytest.mark.parametrize("additional_config, expected", [
    (None, MegakernelOptions()),
    ({}, MegakernelOptions()),
    ({"other_plugin": {"x": 1}}, MegakernelOptions()),
    ({"megakernel": {}}, MegakernelOptions()),
    ({"megakernel": {"enabled": True}}, MegakernelOptions(enabled=True)),
    ({"megakernel": {"enabled": False}}, MegakernelOptions(enabled=False)),
    ({"megakernel": {"enabled": True, "strict": True}}, MegakernelOptions(enabled=True, strict=True)),
    ({"megakernel": '{"enabled": false}'}, MegakernelOptions(enabled=False)),  # a JSON string, as from a CLI
    ({"megakernel": {"enabled": True, "max_batch": 4}}, MegakernelOptions(enabled=True, max_batch=4)),
    ({"megakernel": {"max_batch": 64}}, MegakernelOptions(max_batch=64)),
])
def test_parse_valid_options(additional_config, expected):
    assert parse_options(additional_config) == expected


@pytest.mark.parametrize("additional_config, message", [
    ({"megakernel": {"enable": True}}, "unknown key(s) ['enable']"),
    ({"megakernel": {"enabled": "true"}}, "enabled must be a JSON bool, got str"),
    ({"megakernel": {"enabled": 1}}, "enabled must be a JSON bool, got int"),
    ({"megakernel": {"strict": None}}, "strict must be a JSON bool, got NoneType"),
    ({"megakernel": {"max_batch": "8"}}, "max_batch must be a JSON int, got str"),
    ({"megakernel": {"max_batch": True}}, "max_batch must be a JSON int, got bool"),
    ({"megakernel": {"max_batch": 0}}, "max_batch must be between 1 and 64"),
    ({"megakernel": {"max_batch": 65}}, "max_batch must be between 1 and 64"),
    ({"megakernel": True}, "must be an object"),
    ({"megakernel": "{not json"}, "not JSON"),
    (["megakernel"], "must be a JSON object"),
])
def test_parse_rejects_bad_options_with_a_clear_error(additional_config, message):
    with pytest.raises(MegakernelOptionError) as err:
        parse_options(additional_config)
    assert message in str(err.value)


def supported_config(**overrides):
    cfg = SimpleNamespace(
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
                                        enable_expert_parallel=False, enable_dbo=False),
        speculative_config=None,
        lora_config=None,
        quant_config=None,
        cache_config=SimpleNamespace(cache_dtype="auto"),
        model_config=SimpleNamespace(dtype="torch.bfloat16"),
    )
    for path, value in overrides.items():
        obj = cfg
        *parents, leaf = path.split("__")
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, leaf, value)
    return cfg


GOOD = dict(attention_backends=["FLASH_ATTN"] * 3, moe_backends=["TRITON"] * 2, device_capability=(9, 0))


def test_supported_setup_has_no_reasons():
    assert unsupported_setup_reasons(supported_config(), **GOOD) == []
    from vllm.config.compilation import CUDAGraphMode

    for mode in (CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.PIECEWISE,
                 CUDAGraphMode.NONE):
        graphs = supported_config(compilation_config=SimpleNamespace(cudagraph_mode=mode))
        assert unsupported_setup_reasons(graphs, **GOOD) == []
    full = supported_config(compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL))
    assert unsupported_setup_reasons(full, **GOOD) != []
    # the megakernel simulates vLLM's uniform routing itself (the step table's uniform_routing)
    assert unsupported_setup_reasons(supported_config(), **GOOD, routing_simulation="uniform_random") == []


@pytest.mark.parametrize("override, backends, reason", [
    ({"parallel_config__tensor_parallel_size": 2}, {}, "tensor_parallel_size=2"),
    ({"parallel_config__pipeline_parallel_size": 2}, {}, "pipeline_parallel_size=2"),
    ({"parallel_config__data_parallel_size": 2}, {}, "data_parallel_size=2"),
    ({"parallel_config__enable_expert_parallel": True}, {}, "expert parallelism"),
    ({"parallel_config__enable_dbo": True}, {}, "dual-batch overlap"),
    ({"speculative_config": object()}, {}, "speculative decoding"),
    ({"lora_config": object()}, {}, "LoRA"),
    ({"quant_config": SimpleNamespace(get_name=lambda: "fp8")}, {}, "quantization 'fp8'"),
    ({"cache_config__cache_dtype": "fp8"}, {}, "kv_cache_dtype=fp8"),
    ({"model_config__dtype": "torch.float16"}, {}, "dtype=float16"),
    ({}, {"attention_backends": ["FLASH_ATTN", "FLASHINFER"]}, "attention backend FLASHINFER"),
    ({}, {"moe_backends": ["FLASHINFER_CUTLASS"]}, "MoE backend FLASHINFER_CUTLASS"),
    ({}, {"device_capability": (10, 0)}, "compute capability 10.0"),
    ({}, {"routing_simulation": "normal_random"}, "VLLM_MOE_ROUTING_SIMULATION_STRATEGY=normal_random"),
    ({"kv_transfer_config": object()}, {}, "a KV connector is on"),
    ({}, {"kv_cache_layout": "HND"}, "KV cache layout HND"),
    ({"model_config__enable_return_routed_experts": True}, {}, "enable_return_routed_experts"),
    ({"use_v2_model_runner": True}, {}, "V2 model runner"),
    ({"compilation_config": SimpleNamespace(cudagraph_mode=SimpleNamespace(name="FULL"))}, {}, "cudagraph_mode=FULL"),
])
def test_each_unsupported_setup_is_named(override, backends, reason):
    reasons = unsupported_setup_reasons(supported_config(**override), **{**GOOD, **backends})
    assert len(reasons) == 1 and reason in reasons[0]


def test_decide_default_falls_back_with_every_reason():
    d = decide(MegakernelOptions(), None, ["tensor_parallel_size=2", "LoRA is on"])
    assert not d.use_megakernel
    assert d.log_line() == "vllm_megakernel: decode runs on stock vLLM: tensor_parallel_size=2; LoRA is on"


def test_decide_strict_raises_on_unsupported_setup():
    with pytest.raises(MegakernelUnsupportedError, match="LoRA is on"):
        decide(MegakernelOptions(strict=True), None, ["LoRA is on"])


def test_decide_explicit_enable_without_extension_raises_and_says_why():
    with pytest.raises(MegakernelUnavailableError, match="extension .* is not built"):
        decide(MegakernelOptions(enabled=True), "the CUDA extension vllm_megakernel._C is not built", [])


def test_decide_automatic_without_extension_falls_back():
    d = decide(MegakernelOptions(), "the CUDA extension vllm_megakernel._C is not built", [])
    assert not d.use_megakernel and "not built" in d.log_line()


def test_decide_disabled_is_stock_whatever_else_holds():
    d = decide(MegakernelOptions(enabled=False, strict=True), "not built", ["LoRA is on"])
    assert not d.use_megakernel and "enabled=false" in d.log_line()


def test_decide_supported_setup_with_kernel_uses_it():
    assert decide(MegakernelOptions(enabled=True, strict=True), None, []).use_megakernel


def test_cli_flag_reaches_the_options_and_the_compile_cache_key():
    """`vllm serve --additional-config '{...}'` parses into the dict we read, and on vs off hash differently,
    so the two sides of an A/B never share torch.compile artefacts."""
    import json
    import subprocess
    import sys
    import textwrap

    from conftest import TINY_CONFIG

    code = f"""
        import json
        import vllm.platforms as p
        from vllm.platforms.cpu import CpuPlatform
        p._current_platform = CpuPlatform()
        from vllm.engine.arg_utils import EngineArgs
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        from vllm_megakernel.options import parse_options
        out = {{}}
        for flag in ['{{"megakernel": {{"enabled": true}}}}', '{{"megakernel": {{"enabled": false}}}}']:
            parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
            args = parser.parse_args(["--model", "{TINY_CONFIG}", "--additional-config", flag])
            vc = EngineArgs.from_cli_args(args).create_engine_config()
            out[str(parse_options(vc.additional_config).enabled)] = vc.compute_hash()
        print(json.dumps(out))
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=600, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    hashes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(hashes) == {"True", "False"}
    assert hashes["True"] != hashes["False"]


def test_automatic_mode_runs_the_megakernel_by_default():
    """The vLLM-stage GPU tests passed on the current kernel, so a setup that leaves ``enabled`` out runs the
    megakernel (up to the measured batch limit) wherever it can, and still falls back where it cannot."""
    from vllm_megakernel.options import AUTOMATIC_DEFAULT, MEASURED_MAX_BATCH

    assert AUTOMATIC_DEFAULT
    d = decide(MegakernelOptions(), None, [])
    assert d.use_megakernel and d.max_batch == MEASURED_MAX_BATCH
    assert decide(MegakernelOptions(strict=True), None, []).use_megakernel
    assert not decide(MegakernelOptions(), None, ["LoRA is on"]).use_megakernel  # still falls back
    assert not decide(MegakernelOptions(), "not built", []).use_megakernel


def test_automatic_mode_is_opt_in_when_the_default_is_off(monkeypatch):
    """The switch a kernel change sets back to False until vLLM's GPU tests pass on it again."""
    import vllm_megakernel.options as options

    monkeypatch.setattr(options, "AUTOMATIC_DEFAULT", False)
    d = decide(MegakernelOptions(), None, [])
    assert not d.use_megakernel and d.reasons == (options.OPT_IN_REASON,)
    with pytest.raises(MegakernelUnsupportedError, match="opt-in"):
        decide(MegakernelOptions(strict=True), None, [])
    assert decide(MegakernelOptions(enabled=True), None, []).use_megakernel


def test_batch_limit_by_mode_and_the_log_line_says_which_batches_run_where():
    import vllm_megakernel.options as options

    asked = decide(MegakernelOptions(enabled=True), None, [])
    assert asked.max_batch == options.KERNEL_MAX_BATCH == 64
    chosen = decide(MegakernelOptions(enabled=True, max_batch=4), None, [])
    assert chosen.max_batch == 4
    assert "batches of 1 to 4" in chosen.log_line() and "max_batch" in chosen.log_line()
    assert "larger decode batches" in chosen.log_line()
    auto = decide(MegakernelOptions(), None, [])
    assert auto.max_batch == options.MEASURED_MAX_BATCH
    assert all(folder in auto.log_line() for folder in options.MEASURED_IN)
    # vLLM's largest CUDA graph lowers the limit, never raises it
    assert auto.capped(4, "graphs").max_batch == 4 and "graphs" in auto.capped(4, "graphs").log_line()
    assert auto.capped(64, "graphs") == auto
    assert not decide(MegakernelOptions(max_batch=4), None, ["LoRA is on"]).use_megakernel


def test_measured_batch_limit_is_what_the_committed_sweep_shows():
    """MEASURED_MAX_BATCH: every measured batch up to it, at 8K, ran at least as fast on the megakernel as on
    stock in the committed sweeps of MEASURED_IN (medians), and the next measured batch (if any) did not. A
    batch measured in several of those folders counts from the last one listed (the newest kernel), both
    sides from that same run."""
    import json
    import statistics

    from conftest import REPO
    from vllm_megakernel.options import MEASURED_IN, MEASURED_MAX_BATCH

    rate: dict[tuple[str, int], float] = {}
    for folder in MEASURED_IN:  # a folder may hold one sweep per batch range or context
        found = sorted((REPO / folder).rglob("results.json"))
        assert found, f"no results.json under {folder}"
        runs = [json.loads(run.read_text()) for run in found]
        # the weights' own routing only: a --uniform-routing sweep measures another workload
        cases = [c for run in runs if run["env"]["routing_simulation"] == "off" for c in run["cases"]]
        measured = [c for c in cases if c["context"] == 8192 and c["status"] == "ok"]
        here = {(c["side"], c["batch"]): statistics.median(c["per_request_tok_s"]) * c["batch"] for c in measured}
        assert len(here) == len(measured), f"one (side, batch) measured twice in {folder}: which one counts?"
        for batch in {b for side, b in here if side == "stock"}:  # this folder's runs replace older ones
            for side in ("stock", "megakernel"):
                rate.pop((side, batch), None)
                if (side, batch) in here:
                    rate[(side, batch)] = here[(side, batch)]
    batches = sorted({b for side, b in rate if side == "stock"})
    assert set(batches) >= {1, 2, 4, 8, 16, 32, 64}
    # a batch the megakernel side did not measure counts against it
    wins = [b for b in batches if rate.get(("megakernel", b), 0.0) >= rate[("stock", b)]]
    limit = 0
    for b in batches:
        if b not in wins:
            break
        limit = b
    assert limit == MEASURED_MAX_BATCH

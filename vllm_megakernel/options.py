"""The A/B switch: ``additional_config={"megakernel": {...}}``.

Accepted keys:

- ``enabled``: ``true`` asks for the megakernel, ``false`` is stock vLLM. Left out (automatic mode, on since
  :data:`AUTOMATIC_DEFAULT` is true), the megakernel runs wherever it can (extension built, Hopper GPU,
  supported setup) and stock vLLM runs elsewhere. The kernel before ABI 14 was sanitizer-clean and vLLM's own
  GPU tests (greedy decoding through both CUDA-graph modes, stock equivalence, the server: session U; stepwise
  against stock: session T) passed on it (benchmarks/results/h200-2026-12-03-v2-session-u and
  benchmarks/results/h200-2026-12-03-v2-session-t); on ABI 14 the kernel tests, the local-routing sanitizer
  case and every vLLM-stage test passed (session W: benchmarks/results/h200-2026-12-04-v2-session-w), and
  the sanitizer's default cases (session X: benchmarks/results/h200-2026-12-04-v2-session-x; AUTOMATIC_DEFAULT
  below).
- ``strict``: ``true`` turns every fallback to stock into an error.
- ``max_batch``: the largest decode batch the megakernel takes (1 to the kernel's 64); larger decode
  batches run vLLM's stock forward, captured in the same CUDA graphs (each graph holds the path its batch
  size takes). Default: with ``enabled: true`` the kernel's limit; left out, :data:`MEASURED_MAX_BATCH`,
  the largest batch at which the committed decode sweep measured the megakernel at least as fast as stock.
  vLLM's largest CUDA-graph size caps it too when graphs are on (larger batches run eagerly on vLLM's path).

How a setup is judged:

- ``enabled: false``: stock vLLM, nothing checked.
- The extension is missing (not built, or built without the decode kernel): with ``enabled: true`` (or
  ``strict``) this raises :class:`MegakernelUnavailableError` saying why; left out, stock with one log line.
- Anything else it cannot run (tensor/pipeline/data parallel > 1, expert parallel, dual-batch overlap,
  speculative decoding, LoRA, quantization, a KV cache that is not bf16, a non-FlashAttention backend, a
  MoE backend that re-lays the expert weights, a GPU that is not Hopper): stock with one log line naming
  every reason, or :class:`MegakernelUnsupportedError` with ``strict``.

The dictionary lives in ``VllmConfig.additional_config``, which vLLM hashes into its compile-cache key, so
the two sides of an A/B never share compiled artefacts.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from vllm_megakernel.megakernel.abi import KERNEL

CONFIG_KEY = "megakernel"

# Whether a setup that leaves ``enabled`` out gets the megakernel. On since the vLLM-stage GPU tests
# (tests/gpu/test_vllm_megakernel_e2e.py, test_stock_equivalence.py, test_serve.py) passed on the kernel of
# csrc/ as at b10a799 (benchmarks/results/h200-2026-12-02-v2-vllm-tests-two-speeds), which racecheck, memcheck
# and synccheck also found clean (benchmarks/results/h200-2026-12-02-v2-sanitizer-interleaved). Session S's L2
# cache hint on the weight and K/V copies changes no result (bit-equal outputs at batch 1, 8 and 64, the kernel
# tests pass; benchmarks/results/h200-2026-12-03-v2-l2-hints). On that kernel with session T's live attention split
# cap (a schedule choice at batch 1-8) the kernel tests and test_vllm_megakernel_e2e.py's stepwise cases passed
# (benchmarks/results/h200-2026-12-03-v2-session-t), and in session U every sanitizer case (memcheck, racecheck,
# synccheck), the greedy cases through both graph modes, test_stock_equivalence.py and test_serve.py
# (benchmarks/results/h200-2026-12-03-v2-session-u; the vLLM tests with batch 2's combines on the empty splits,
# a placement that gives bit-equal outputs). Session V's ABI 14 (ROUTER_TOPK's code shared with the local-routing
# producers, the scores kept per layer) passed the kernel tests and the local-routing sanitizer case
# (benchmarks/results/h200-2026-12-04-v2-local-routing), and in session W every vLLM-stage test above
# (benchmarks/results/h200-2026-12-04-v2-session-w), and in session X the sanitizer's two default cases
# (memcheck, racecheck, synccheck; benchmarks/results/h200-2026-12-04-v2-session-x). A kernel change that has not been through those tests again may set it back to False: then
# ``enabled: true`` opts in,
# everything else is stock vLLM, and the log line says how to opt in (OPT_IN_REASON).
AUTOMATIC_DEFAULT = True
OPT_IN_REASON = ("the megakernel is opt-in until vLLM's GPU tests have passed on the current kernel: set "
                 "additional_config.megakernel.enabled=true")

# The largest decode batch measured at least as fast as stock vLLM -- together with every smaller batch
# measured -- in the committed H200 sweeps below (8K, the weights' own routing; a batch measured in several
# counts from the last folder listed): batch 1-8 on the current kernel (session AM, csrc/ as at 7503110, ABI 19:
# 2.00 / 1.69 / 1.52 / 1.39x at batch 1 / 2 / 4 / 8), batch 16 on session V's (csrc/ as at 9df348d: 1.15x), batch
# 32 and 64 on session X's (1.06 / 1.04x; session S's kernel measured 1.09 / 1.06x there). A CPU test recomputes it
# from their results.json files. Older kernels' sweeps stay in benchmarks/results (the README names them).
MEASURED_MAX_BATCH = 64
MEASURED_IN = ("benchmarks/results/h200-2026-12-03-v2-l2-hints/call3/sweep",
               "benchmarks/results/h200-2026-12-03-v2-l2-hints/call4/sweep",
               "benchmarks/results/h200-2026-12-04-v2-local-routing/call3/sweep",
               "benchmarks/results/h200-2026-12-04-v2-session-x/call3/sweep",
               "benchmarks/results/h200-2026-12-05-session-am/call9-sweep/sweep")
KERNEL_MAX_BATCH = KERNEL["max_batch"]

_FIELDS: dict[str, type] = {"enabled": bool, "strict": bool, "max_batch": int}


class MegakernelOptionError(ValueError):
    """The ``megakernel`` entry of ``additional_config`` is malformed."""


class MegakernelUnavailableError(RuntimeError):
    """The megakernel was asked for but this installation cannot provide it."""


class MegakernelUnsupportedError(RuntimeError):
    """``strict`` was set and the setup needs the stock path."""


@dataclasses.dataclass(frozen=True)
class MegakernelOptions:
    enabled: bool | None = None  # None: automatic (on where it can run)
    strict: bool = False
    max_batch: int | None = None  # None: the default of the mode (module docstring)

    @property
    def explicitly_enabled(self) -> bool:
        return self.enabled is True


def parse_options(additional_config: Mapping[str, Any] | None) -> MegakernelOptions:
    """Reads ``additional_config["megakernel"]``; raises :class:`MegakernelOptionError` on bad input."""
    if additional_config is None:
        return MegakernelOptions()
    if not isinstance(additional_config, Mapping):
        raise MegakernelOptionError(
            f"additional_config must be a JSON object, got {type(additional_config).__name__}"
        )
    raw = additional_config.get(CONFIG_KEY)
    if raw is None:
        return MegakernelOptions()
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise MegakernelOptionError(
                f"additional_config.{CONFIG_KEY} is a string that is not JSON: {raw!r} ({e})"
            ) from None
    if not isinstance(raw, Mapping):
        raise MegakernelOptionError(
            f"additional_config.{CONFIG_KEY} must be an object such as "
            f'{{"enabled": true}}, got {type(raw).__name__}: {raw!r}'
        )
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise MegakernelOptionError(
            f"unknown key(s) {unknown} in additional_config.{CONFIG_KEY}; "
            f"accepted keys: {sorted(_FIELDS)}"
        )
    values: dict[str, Any] = {}
    for key, value in raw.items():
        expected = _FIELDS[key]
        # bool is checked exactly: 1, "true" and None are refused rather than guessed at.
        if type(value) is not expected:
            raise MegakernelOptionError(
                f"additional_config.{CONFIG_KEY}.{key} must be a JSON {expected.__name__}, "
                f"got {type(value).__name__}: {value!r}"
            )
        values[key] = value
    if "max_batch" in values and not 1 <= values["max_batch"] <= KERNEL_MAX_BATCH:
        raise MegakernelOptionError(
            f"additional_config.{CONFIG_KEY}.max_batch must be between 1 and {KERNEL_MAX_BATCH} (the kernel's "
            f"limit), got {values['max_batch']}"
        )
    return MegakernelOptions(**values)


@dataclasses.dataclass(frozen=True)
class Decision:
    use_megakernel: bool
    reasons: tuple[str, ...] = ()  # why not, when use_megakernel is False
    max_batch: int = 0  # the largest decode batch the megakernel takes, when it is on
    max_batch_reason: str = ""

    def capped(self, limit: int, why: str) -> Decision:
        """The same decision with its batch limit lowered to ``limit`` (for ``why``) if that is lower."""
        if not self.use_megakernel or limit >= self.max_batch:
            return self
        return dataclasses.replace(self, max_batch=limit, max_batch_reason=why)

    def log_line(self) -> str:
        if self.use_megakernel:
            return (f"vllm_megakernel: decode runs on the megakernel for batches of 1 to {self.max_batch} "
                    f"({self.max_batch_reason}); larger decode batches, prefill and mixed batches run on stock vLLM")
        return "vllm_megakernel: decode runs on stock vLLM: " + "; ".join(self.reasons)


# vLLM's VLLM_MOE_ROUTING_SIMULATION_STRATEGY value the megakernel simulates too (the step table's
# uniform_routing); any other simulated routing runs on stock vLLM.
UNIFORM_ROUTING = "uniform_random"


def unsupported_setup_reasons(
    vllm_config: Any,
    attention_backends: Iterable[str] = (),
    moe_backends: Iterable[str] = (),
    device_capability: tuple[int, int] | None = None,
    routing_simulation: str = "",
    kv_cache_layout: str = "NHD",
) -> list[str]:
    """Every reason the megakernel cannot serve this setup (empty when it can).

    ``attention_backends`` are the backend names of the model's ``Attention`` layers, ``moe_backends`` the
    expert-kernel backends of its MoE layers, ``device_capability`` the GPU's (major, minor); all three are
    known only once the model is built on a device, so the caller passes them in. ``routing_simulation``
    is vLLM's VLLM_MOE_ROUTING_SIMULATION_STRATEGY, ``kv_cache_layout`` vLLM's KV cache layout
    (vllm.v1.attention.backends.utils.get_kv_cache_layout: NHD unless VLLM_KV_CACHE_LAYOUT or a KV connector
    asks for HND).
    """
    reasons: list[str] = []
    par = vllm_config.parallel_config
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        size = getattr(par, name, 1)
        if size != 1:
            reasons.append(f"{name}={size} (only 1 is supported)")
    if getattr(par, "enable_expert_parallel", False):
        reasons.append("expert parallelism is on")
    if getattr(par, "enable_dbo", False):
        reasons.append("dual-batch overlap is on")
    if vllm_config.speculative_config is not None:
        reasons.append("speculative decoding is on")
    if vllm_config.lora_config is not None:
        reasons.append("LoRA is on")
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        # its per-layer load waits and saves hang off vLLM's attention op, which a megakernel step never calls
        reasons.append("a KV connector is on (kv_transfer_config): the megakernel neither waits for a layer's "
                       "KV to load nor saves it layer by layer")
    if kv_cache_layout != "NHD":
        reasons.append(f"KV cache layout {kv_cache_layout} (the megakernel reads FlashAttention's NHD blocks)")
    if getattr(vllm_config.model_config, "enable_return_routed_experts", False):
        reasons.append("enable_return_routed_experts is on (the megakernel's routing does not reach vLLM's "
                       "routed-experts capture)")
    mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
    if getattr(mode, "name", None) == "FULL":
        # vLLM captures every FULL graph of this mode with a mixed dummy batch (max_query_len = its token
        # count), so the graphs it replays for decode batches hold the stock forward, not the megakernel
        reasons.append("cudagraph_mode=FULL captures decode batches as mixed ones (use FULL_AND_PIECEWISE, vLLM's "
                       "default, or FULL_DECODE_ONLY)")
    if getattr(vllm_config, "use_v2_model_runner", False):
        reasons.append("vLLM's V2 model runner is on (VLLM_USE_V2_MODEL_RUNNER; the megakernel is built and "
                       "tested against the V1 runner's buffers and CUDA graphs)")
    if vllm_config.quant_config is not None:
        reasons.append(f"quantization {vllm_config.quant_config.get_name()!r} is on")
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    if cache_dtype not in ("auto", "bfloat16"):
        reasons.append(f"kv_cache_dtype={cache_dtype} (only bf16 is supported)")
    dtype = str(vllm_config.model_config.dtype).removeprefix("torch.")
    if dtype != "bfloat16":
        reasons.append(f"dtype={dtype} (only bfloat16 is supported)")
    others = sorted({b for b in attention_backends if b != "FLASH_ATTN"})
    if others:
        reasons.append(f"attention backend {', '.join(others)} (only FLASH_ATTN is supported)")
    others = sorted({b for b in moe_backends if b != "TRITON"})
    if others:
        reasons.append(
            f"MoE backend {', '.join(others)} re-lays the expert weights (only TRITON is supported; "
            "pass --moe-backend triton)"
        )
    if routing_simulation not in ("", UNIFORM_ROUTING):
        reasons.append(f"VLLM_MOE_ROUTING_SIMULATION_STRATEGY={routing_simulation} (the megakernel simulates "
                       f"only {UNIFORM_ROUTING})")
    if device_capability is not None and tuple(device_capability) != (9, 0):
        major, minor = device_capability
        reasons.append(f"GPU compute capability {major}.{minor} (the megakernel is built for sm_90a)")
    return reasons


def decide(
    options: MegakernelOptions,
    extension_problem: str | None,
    setup_reasons: list[str],
) -> Decision:
    """Applies the rules in this module's docstring; raises where they say to."""
    if options.enabled is False:
        return Decision(False, ("disabled by additional_config.megakernel.enabled=false",))
    if extension_problem is not None:
        if options.explicitly_enabled or options.strict:
            raise MegakernelUnavailableError(
                f"additional_config.megakernel asks for the megakernel, but {extension_problem}"
            )
        return Decision(False, (extension_problem,))
    if not setup_reasons and options.enabled is None and not AUTOMATIC_DEFAULT:
        setup_reasons = [OPT_IN_REASON]
    if setup_reasons:
        if options.strict:
            raise MegakernelUnsupportedError(
                "additional_config.megakernel.strict=true and this setup needs stock vLLM: "
                + "; ".join(setup_reasons)
            )
        return Decision(False, tuple(setup_reasons))
    if options.max_batch is not None:
        limit, why = options.max_batch, "additional_config.megakernel.max_batch"
    elif options.explicitly_enabled:
        limit, why = KERNEL_MAX_BATCH, "the kernel's limit"
    else:
        limit, why = MEASURED_MAX_BATCH, "measured at least as fast as stock up to there: " + ", ".join(MEASURED_IN)
    return Decision(True, max_batch=limit, max_batch_reason=why)

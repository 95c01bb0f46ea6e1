"""Our subclass of vLLM's in-tree ``Cohere2MoeForCausalLM`` (North Mini Code).

It adds the megakernel decision and nothing else: with the megakernel off (or unavailable) every method is
vLLM's own, so the B side of an A/B is stock vLLM on the same weights, KV cache and graphs.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.models.cohere2_moe import Cohere2MoeForCausalLM
from vllm.platforms import current_platform

from vllm_megakernel import extension
from vllm_megakernel.options import (
    Decision,
    decide,
    parse_options,
    unsupported_setup_reasons,
)

# A child of vLLM's "vllm" logger: vLLM configures only that tree, so this gets its handler, format and
# VLLM_LOGGING_LEVEL; a logger named after our package would print nothing at INFO.
logger = init_logger("vllm.megakernel")


def attention_backend_names(model: nn.Module) -> Iterator[str]:
    for module in model.modules():
        if isinstance(module, Attention):
            yield module.attn_backend.get_name()


def moe_backend_names(model: nn.Module) -> Iterator[str]:
    """The expert-kernel backend of every MoE layer, e.g. ``TRITON``; ``None`` layers are skipped."""
    for module in model.modules():
        backend = getattr(getattr(module, "quant_method", None), "unquantized_backend", None)
        if backend is not None:
            yield str(getattr(backend, "name", backend))


class MegakernelCohere2MoeForCausalLM(Cohere2MoeForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        # Options are parsed first so that a typo fails before minutes of weight loading.
        options = parse_options(vllm_config.additional_config)
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.megakernel_decision: Decision = self._decide(vllm_config, options)

    def _decide(self, vllm_config: VllmConfig, options) -> Decision:
        if options.enabled is False:
            decision = decide(options, None, [])
        else:
            _, problem = extension.load()
            capability = current_platform.get_device_capability()
            reasons = unsupported_setup_reasons(
                vllm_config,
                attention_backends=attention_backend_names(self),
                moe_backends=moe_backend_names(self),
                device_capability=None if capability is None else tuple(capability),
            )
            if not current_platform.is_cuda():
                reasons.append(f"platform {type(current_platform).__name__} is not CUDA")
            decision = decide(options, problem, reasons)
        log = logger.warning if options.explicitly_enabled and not decision.use_megakernel else logger.info
        log(decision.log_line())
        return decision

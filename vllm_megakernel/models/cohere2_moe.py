"""Our subclass of vLLM's in-tree ``Cohere2MoeForCausalLM`` (North Mini Code).

With the megakernel off (or unavailable) every method is vLLM's own, so the B side of an A/B is stock vLLM
on the same weights, KV cache and graphs. With it on, pure-decode batches (one query token per request)
up to the megakernel's batch limit run as one megakernel launch that writes the final hidden states into
a persistent buffer; everything else -- prefill, mixed batches, profiling runs, larger batches -- calls
vLLM's forward. The branch is taken here, outside the torch.compile'd model, and each FULL decode graph
captures whichever side its batch size takes.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.models.cohere2_moe import Cohere2MoeForCausalLM
from vllm.platforms import current_platform

from vllm_megakernel import extension
from vllm_megakernel.options import (
    UNIFORM_ROUTING,
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


def _kv_cache_layout() -> str:
    """vLLM's KV cache layout for this engine (NHD unless VLLM_KV_CACHE_LAYOUT or a KV connector asks for HND)."""
    from vllm.v1.attention.backends.utils import get_kv_cache_layout

    return get_kv_cache_layout() or "NHD"


def _routing_simulation() -> str:
    """vLLM's VLLM_MOE_ROUTING_SIMULATION_STRATEGY (stock's router reads the same): "" when routing is real."""
    import vllm.envs as envs

    return envs.VLLM_MOE_ROUTING_SIMULATION_STRATEGY or ""


class MegakernelCohere2MoeForCausalLM(Cohere2MoeForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        # Options are parsed first so that a typo fails before minutes of weight loading.
        options = parse_options(vllm_config.additional_config)
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        routing_simulation = _routing_simulation()
        self.megakernel_decision: Decision = self._decide(vllm_config, options, routing_simulation)
        self.megakernel = None
        if self.megakernel_decision.use_megakernel:
            from vllm_megakernel.megakernel.vllm_decoder import MegakernelDecoder, prebuilt_batches

            ext, _ = extension.load()
            max_batch = self.megakernel_decision.max_batch
            self.megakernel = MegakernelDecoder(
                self, vllm_config.model_config.hf_config, vllm_config.model_config.max_model_len,
                num_sms=ext.query_device(torch.cuda.current_device())["sm_count"],
                max_batch=max_batch,
                uniform_routing=routing_simulation == UNIFORM_ROUTING,
                prebuild=prebuilt_batches(vllm_config.compilation_config, vllm_config.scheduler_config, max_batch),
            )
            # A buffer of the model, so that vLLM's level-2 sleep (which discards the memory allocated while
            # the model is built and restores only its buffers) gives the stall record back cleared; the rest
            # of the decoder's workspace is rewritten by every step before it is read.
            self.register_buffer("megakernel_stall_record", self.megakernel.error, persistent=False)

    @torch.no_grad()
    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        mk = self.megakernel
        if mk is not None and mk.eligible(input_ids, inputs_embeds, intermediate_tensors):
            return mk.decode(input_ids, positions)
        return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states):
        if self.megakernel is not None:
            hidden_states = self.megakernel.poison_on_error(hidden_states)
        return super().compute_logits(hidden_states)

    def _decide(self, vllm_config: VllmConfig, options, routing_simulation: str) -> Decision:
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
                routing_simulation=routing_simulation,
                kv_cache_layout=_kv_cache_layout(),
            )
            if not current_platform.is_cuda():
                reasons.append(f"platform {type(current_platform).__name__} is not CUDA")
            from vllm_megakernel.megakernel.vllm_decoder import unsupported_model_reasons

            reasons += unsupported_model_reasons(vllm_config.model_config.hf_config)
            decision = decide(options, problem, reasons)
            from vllm_megakernel.megakernel.vllm_decoder import batch_limit

            decision = decision.capped(batch_limit(vllm_config.compilation_config, decision.max_batch),
                                       "vLLM's largest CUDA-graph size")
        log = logger.warning if options.explicitly_enabled and not decision.use_megakernel else logger.info
        log(decision.log_line())
        return decision

"""vLLM plugin: a decode megakernel for North Mini Code (vLLM's ``Cohere2MoeForCausalLM``).

``register()`` is the ``vllm.general_plugins`` entry point. vLLM calls it in every process it starts (API
server, engine core, workers, the model-inspection subprocess), so it must be idempotent and must not
touch CUDA: it only points the architecture name at our subclass, lazily, by module path.
"""

ARCHITECTURE = "Cohere2MoeForCausalLM"
MODEL_CLASS = "vllm_megakernel.models.cohere2_moe:MegakernelCohere2MoeForCausalLM"

__version__ = "0.1.0"


def register() -> None:
    from vllm import ModelRegistry

    module_name, class_name = MODEL_CLASS.split(":")
    current = ModelRegistry.models.get(ARCHITECTURE)
    if (
        getattr(current, "module_name", None) == module_name
        and getattr(current, "class_name", None) == class_name
    ):
        return
    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)

"""The plugin as vLLM sees it: discovered through its entry point, registered in every process without
touching CUDA, and resolving our config to our subclass of vLLM's in-tree model."""

import json
import subprocess
import sys
import textwrap

from conftest import FULL_CONFIG, REPO

from vllm_megakernel import ARCHITECTURE, MODEL_CLASS


def run_python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=600, cwd="/",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip().splitlines()[-1]


def test_entry_point_is_declared_in_vllm_general_plugins():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("megakernel") == "vllm_megakernel:register"


def test_fresh_process_discovers_plugin_and_overrides_architecture_without_cuda():
    out = run_python(
        """
        import json, torch
        from vllm import ModelRegistry
        before = ModelRegistry.models["Cohere2MoeForCausalLM"]
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        load_general_plugins()  # vLLM calls it once per process; a second call must change nothing
        import vllm_megakernel
        vllm_megakernel.register()
        after = ModelRegistry.models["Cohere2MoeForCausalLM"]
        print(json.dumps({
            "before": before.module_name, "after": f"{after.module_name}:{after.class_name}",
            "cuda_initialized": torch.cuda.is_initialized(),
        }))
        """
    )
    got = json.loads(out)
    assert got["before"] == "vllm.model_executor.models.cohere2_moe"
    assert got["after"] == MODEL_CLASS
    assert got["cuda_initialized"] is False


def test_vllm_plugins_filter_can_turn_the_plugin_off():
    """VLLM_PLUGINS='' is how a user runs vLLM without us (the 'no plugin' side of a comparison)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(
            """
            from vllm import ModelRegistry
            from vllm.plugins import load_general_plugins
            load_general_plugins()
            print(ModelRegistry.models["Cohere2MoeForCausalLM"].module_name)
            """
        )],
        capture_output=True, text=True, timeout=600, cwd="/", env={**__import__("os").environ, "VLLM_PLUGINS": ""},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "vllm.model_executor.models.cohere2_moe"


def test_north_mini_code_config_resolves_to_our_class():
    out = run_python(
        f"""
        import json
        from vllm.engine.arg_utils import EngineArgs
        from vllm.model_executor.models.registry import ModelRegistry
        mc = EngineArgs(model="{FULL_CONFIG}", load_format="dummy").create_model_config()
        cls, arch = ModelRegistry.resolve_model_cls(mc.architectures, model_config=mc)
        from vllm.model_executor.models.cohere2_moe import Cohere2MoeForCausalLM
        print(json.dumps({{"arch": arch, "cls": f"{{cls.__module__}}:{{cls.__name__}}",
                          "subclass": issubclass(cls, Cohere2MoeForCausalLM)}}))
        """
    )
    got = json.loads(out)
    assert got == {"arch": ARCHITECTURE, "cls": MODEL_CLASS, "subclass": True}
    assert (REPO / "configs" / "north-mini-code" / "tokenizer.json").exists()

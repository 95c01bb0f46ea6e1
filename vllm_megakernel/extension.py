"""Loads the compiled extension ``vllm_megakernel._C`` and says plainly why it cannot serve, if it cannot."""

from __future__ import annotations

import functools
from types import ModuleType

BUILD_HINT = (
    "build it on a machine with nvcc (CUDA 12.8+ for sm_90a): "
    "pip install --no-build-isolation -e . (or pip install . ) from the vllm-megakernel checkout"
)


@functools.cache
def load() -> tuple[ModuleType | None, str | None]:
    """Returns ``(module, None)`` when the decode megakernel can be launched, else ``(module_or_None, why)``."""
    try:
        from vllm_megakernel import _C
    except ImportError as e:
        return None, f"the CUDA extension vllm_megakernel._C is not built ({e}); {BUILD_HINT}"
    info = _C.build_info()
    if not info.get("decode_kernel", False):
        return _C, (
            "this build of vllm_megakernel._C has no decode megakernel yet "
            f"(extension {info.get('version')}, built for {info.get('cuda_arch')})"
        )
    if problem := abi_mismatch(_C):
        return _C, f"this build of vllm_megakernel._C is {problem}: rebuild it; {BUILD_HINT}"
    return _C, None


@functools.cache
def abi_mismatch(module: ModuleType, expected: int | None = None) -> str | None:
    """Why ``module`` (a build of the extension) must not be launched by this checkout's Python (ABI
    ``expected``, default abi.ABI_VERSION), or None: its step, layer and task tables are read by word offsets,
    so a build of another ABI version would read this Python's tables wrong (a wrong answer or a stall, not an
    error). Each caller adds how to rebuild."""
    if expected is None:
        from vllm_megakernel.megakernel.abi import ABI_VERSION as expected
    built = module.build_info().get("abi_version")
    if built == expected:
        return None
    return f"built for ABI {built}, this checkout's Python is for ABI {expected} (the step and task layouts differ)"

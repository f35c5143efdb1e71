"""mmaemu: NVIDIA FP8 tensor-core GEMMs (``torch._scaled_mm``, Transformer Engine), bit for bit, on any CPU or
CUDA GPU.

Top-level names are resolved lazily: ``import mmaemu`` imports neither torch nor CUDA.
"""

from __future__ import annotations

import importlib

from ._version import __version__

_EXPORTS = {
    "scaled_mm": "api",
    "accumulate": "api",
    "explain": "api",
    "CallPlan": "api",
    "scaled_mm_v2": "scaled_v2",
    "scaled_grouped_mm": "grouped",
    "resolve_splitk": "platform.splitk",
    "SplitK": "platform.splitk",
    "SplitDecision": "platform.splitk",
    "get_profile": "platform.profiles",
    "list_profiles": "platform.profiles",
    "Profile": "platform.profiles",
    "load_profile": "platform.bundles",
    "profile_from_preset": "platform.profiles",
    "get_preset": "model.presets",
    "list_presets": "model.presets",
    "Preset": "model.presets",
    "backends_status": "backends",
    "selftest": "backends",
    "patch": "patching",
    "quantize_e4m3": "quantize",
    "quantize_e5m2": "quantize",
    "MmaemuError": "errors",
    "ReferenceRejectsError": "errors",
    "UnsupportedFeatureError": "errors",
    "SplitKUnknownError": "errors",
    "BackendUnavailableError": "errors",
    "ExperimentalPresetWarning": "errors",
    "UnverifiedSplitWarning": "errors",
    "UnvalidatedEnvelopeWarning": "errors",
    "AssumedUnsplitWarning": "errors",
    "BackendFallbackWarning": "errors",
    "CacheWarning": "errors",
}
_SUBMODULES = ("model", "platform", "backends", "testing", "formats", "api", "errors", "nn", "quantize", "patching",
               "cpu", "cuda", "arith", "plan", "warn")

__all__ = ["__version__"]  # a literal first: pyflakes then sees the re-export of _version
__all__ += sorted(_EXPORTS) + list(_SUBMODULES)


def __getattr__(name):
    if name in _EXPORTS:
        module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'mmaemu' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))

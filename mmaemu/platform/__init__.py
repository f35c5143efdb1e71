"""The platform layer: reference profiles and split-K decisions (platform.md sections 1-3).

* :mod:`.definitions` — ``Profile``, ``RejectRule``, the built-in profiles, the format and output names;
* :mod:`.profiles` — ``get_profile``, ``list_profiles``, ``profile_from_preset``, maturity warnings;
* :mod:`.tables` — the recorded cuBLASLt heuristic tables shipped as package data;
* :mod:`.splitk` — ``SplitK``, ``SplitDecision``, ``resolve_splitk``, ``check_scheme_for_preset``;
* :mod:`.cublaslt` — device matching and the loaded cuBLASLt's version (ctypes, no optional extra);
* :mod:`.heuristic` — the cuBLASLt heuristic query through NVIDIA's bindings (live query and recorder);
* :mod:`.table_format` / :mod:`.bundles` / :mod:`.bundle_schema` — the recorded table format; recorded profile
  bundles (``load_profile``, ``$MMAEMU_PROFILE_PATH``) and the schema of their json files.

Names are resolved lazily: importing this package imports neither numpy, torch nor any CUDA library.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Profile": "profiles",
    "RejectRule": "profiles",
    "get_profile": "profiles",
    "list_profiles": "profiles",
    "profile_from_preset": "profiles",
    "warn_profile_maturity": "profiles",
    "profile_maturity_messages": "profiles",
    "SplitK": "splitk",
    "SplitDecision": "splitk",
    "resolve_splitk": "splitk",
    "check_scheme_for_preset": "splitk",
    "SCHEMES": "splitk",
    "CublasLtError": "cublaslt",
    "load_profile": "bundles",
    "BundleError": "bundles",
}

_SUBMODULES = ("definitions", "profiles", "tables", "splitk", "cublaslt", "heuristic", "bundles", "table_format",
               "bundle_schema")
__all__ = sorted(_EXPORTS) + list(_SUBMODULES)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

"""torch for the recipe modules, imported at its first use: explaining a call on the CPU plans it through the
recipes without importing torch (seconds of start-up; tests/test_plan_descriptors.py), while computing one uses
torch throughout."""

from __future__ import annotations

__all__ = ["torch_for", "BitsDtypes"]


class _Torch:
    """Stands for torch in a module's globals until the first attribute is read, then puts the real module there
    (so later reads are plain global lookups, no indirection on the compute path)."""

    def __init__(self, namespace: dict):
        self._namespace = namespace

    def __getattr__(self, name):
        import torch

        self._namespace["torch"] = torch
        return getattr(torch, name)


def torch_for(namespace: dict):
    """The stand-in of torch for the module whose ``globals()`` is ``namespace`` (``torch = torch_for(globals())``)."""
    return _Torch(namespace)


class BitsDtypes(dict):
    """{output dtype name: the unsigned torch dtype of its bits}, each torch dtype looked up at its first use."""

    _NAMES = {"float32": "uint32", "bfloat16": "uint16", "float16": "uint16", "float8_e4m3fn": "uint8",
              "float8_e5m2": "uint8"}

    def __missing__(self, name):
        import torch

        value = getattr(torch, self._NAMES[name])
        self[name] = value
        return value

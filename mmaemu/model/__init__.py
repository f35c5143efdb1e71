"""The tensor-core model at the instruction level: presets and ``dot``.

``dot`` is resolved lazily, so importing the presets does not compile or import Numba.
"""

from .presets import Preset, get_preset, list_presets

__all__ = ["dot", "Preset", "get_preset", "list_presets"]


def __getattr__(name):
    if name == "dot":
        from .instruction import dot

        return dot
    raise AttributeError(f"module 'mmaemu.model' has no attribute {name!r}")

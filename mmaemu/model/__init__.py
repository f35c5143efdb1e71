"""The tensor-core model at the instruction level: presets and ``dot``."""

from .dot import dot
from .presets import Preset, get_preset, list_presets

__all__ = ["dot", "Preset", "get_preset", "list_presets"]

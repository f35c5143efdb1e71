"""Refusal to compute on a CPU thread that flushes fp32 subnormals to zero (semantics.md (e), last paragraph).

The probe is :func:`mmaemu.fpmode.fp32_subnormals_flushed` (a few microseconds); it runs once per computing call,
on CPU tensors only.
"""

from __future__ import annotations

from ..errors import MmaemuError
from ..fpmode import fp32_subnormals_flushed

__all__ = ["check_no_flush_to_zero", "fp32_subnormals_flushed"]


def check_no_flush_to_zero() -> None:
    """Raise :class:`~mmaemu.errors.MmaemuError` if fp32 subnormals are flushed on this CPU thread."""
    if fp32_subnormals_flushed():
        raise MmaemuError(
            "this CPU thread flushes fp32 subnormals to zero (flush-to-zero / denormals-are-zero mode, e.g. after "
            "torch.set_flush_denormal(True)), so mmaemu cannot reproduce the GPU's bits; call "
            "torch.set_flush_denormal(False) before computing"
        )

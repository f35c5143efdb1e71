"""Refusal to compute on a CPU thread that flushes fp32 subnormals to zero (semantics.md (e), last paragraph).

Every step of the arithmetic is one IEEE rounding with gradual underflow; a thread in flush-to-zero /
denormals-are-zero mode (``torch.set_flush_denormal(True)``) would silently give different bits. Two probes, done
with torch CPU tensor ops because that is the mode users flip:

* float64 3 * 2**-149 converted to fp32 must be nonzero (an fp32 subnormal result is not flushed);
* fp32 2**-130 * 0.5 must be nonzero (a subnormal operand is not treated as zero, nor the subnormal product).

The probes are read back as integer bit patterns, so the read-back itself cannot be flushed. Cost: a few
microseconds; run it once per computing call, on CPU tensors only.
"""

from __future__ import annotations

import torch

from ..errors import MmaemuError

__all__ = ["check_no_flush_to_zero", "fp32_subnormals_flushed"]

_FP32_2_POW_MINUS_130_BITS = 1 << 19  # 2**-130 = 2**19 * 2**-149, an fp32 subnormal

_probes: tuple[torch.Tensor, torch.Tensor] | None = None


def _probe_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """The two probe inputs, built once from exact values (3 * 2**-149 is a normal float64)."""
    global _probes
    if _probes is None:
        three_min_subnormals_f64 = torch.tensor([3.0 * 2.0**-149], dtype=torch.float64)
        subnormal_f32 = torch.tensor([_FP32_2_POW_MINUS_130_BITS], dtype=torch.int32).view(torch.float32)
        _probes = (three_min_subnormals_f64, subnormal_f32)
    return _probes


def fp32_subnormals_flushed() -> bool:
    """True when this CPU thread flushes fp32 subnormal results or treats subnormal operands as zero."""
    three_min_subnormals_f64, subnormal_f32 = _probe_tensors()
    converted_bits = three_min_subnormals_f64.to(torch.float32).view(torch.int32).item()
    halved_bits = (subnormal_f32 * 0.5).view(torch.int32).item()
    return converted_bits == 0 or halved_bits == 0


def check_no_flush_to_zero() -> None:
    """Raise :class:`~mmaemu.errors.MmaemuError` if fp32 subnormals are flushed on this CPU thread."""
    if fp32_subnormals_flushed():
        raise MmaemuError(
            "this CPU thread flushes fp32 subnormals to zero (flush-to-zero / denormals-are-zero mode, e.g. after "
            "torch.set_flush_denormal(True)), so mmaemu cannot reproduce the GPU's bits; call "
            "torch.set_flush_denormal(False) before computing"
        )

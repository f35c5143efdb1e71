"""Whether the calling thread flushes fp32 subnormals: flush-to-zero (FTZ) or denormals-are-zero (DAZ) mode.

The mode belongs to a thread (x86 MXCSR, Arm FPCR): ``torch.set_flush_denormal(True)`` sets it, and so does loading
a library built with ``-ffast-math``; a new thread inherits the mode of the thread that starts it. Every step of
mmaemu's arithmetic is one IEEE rounding with gradual underflow, so a thread in that mode would silently give
other bits. Two probes, in numpy (the mode is the thread's, whichever library runs the operation; numpy is
always loaded, torch need not be):

* float64 3 * 2**-149 converted to fp32 must be nonzero (an fp32 subnormal result is not flushed);
* fp32 2**-130 * 0.5 must be nonzero (a subnormal operand is not treated as zero, nor the subnormal product).

The probes are read back as integer bit patterns, so the read-back itself cannot be flushed. Cost: about 2 µs.
:func:`check_no_flush_to_zero` is the refusal every computing entry point applies (semantics.md (e), last
paragraph; :mod:`mmaemu.plan.flush` gives it to the plan).
"""

from __future__ import annotations

import numpy as np

from ..errors import MmaemuError

__all__ = ["fp32_subnormals_flushed", "check_no_flush_to_zero"]

_THREE_MIN_SUBNORMALS_F64 = np.array([3.0 * 2.0**-149], np.float64)  # a normal float64
_SUBNORMAL_F32 = np.array([1 << 19], np.int32).view(np.float32)  # 2**-130 = 2**19 * 2**-149
for _probe in (_THREE_MIN_SUBNORMALS_F64, _SUBNORMAL_F32):
    _probe.setflags(write=False)


def fp32_subnormals_flushed() -> bool:
    """True when this thread flushes fp32 subnormal results or treats subnormal operands as zero."""
    converted = _THREE_MIN_SUBNORMALS_F64.astype(np.float32).view(np.int32)[0]
    halved = (_SUBNORMAL_F32 * np.float32(0.5)).view(np.int32)[0]
    return converted == 0 or halved == 0


def check_no_flush_to_zero() -> None:
    """Raise :class:`~mmaemu.errors.MmaemuError` if fp32 subnormals are flushed on this CPU thread."""
    if fp32_subnormals_flushed():
        raise MmaemuError(
            "this CPU thread flushes fp32 subnormals to zero (flush-to-zero / denormals-are-zero mode, e.g. after "
            "torch.set_flush_denormal(True)), so mmaemu cannot reproduce the GPU's bits; call "
            "torch.set_flush_denormal(False) before computing"
        )

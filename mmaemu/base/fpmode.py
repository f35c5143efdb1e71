"""Whether the calling thread flushes fp32 subnormals: flush-to-zero (FTZ) or denormals-are-zero (DAZ) mode.

The mode belongs to a thread (x86 MXCSR, Arm FPCR): ``torch.set_flush_denormal(True)`` sets it, and so does loading
a library built with ``-ffast-math``; a new thread inherits the mode of the thread that starts it. Every step of
mmaemu's arithmetic is one IEEE rounding with gradual underflow, so a thread in that mode would silently give
other bits. Where one register bit decides the mode for every width (x86-64, AArch64: :data:`_UNIFORM_MODE`), two
Python float64 products probe it (about 0.15 µs): 2**-1022 * 0.5 (a subnormal result, flushed by FTZ) and
3 * 2**-1074 * 1.0 (a subnormal operand, read as zero by DAZ) must be nonzero; their comparison with zero can
itself read a subnormal as zero only in DAZ mode, which is a flushing mode. Elsewhere two probes in numpy fp32
(the mode is the thread's, whichever library runs the operation; numpy is always loaded, torch need not be):

* float64 3 * 2**-149 converted to fp32 must be nonzero (an fp32 subnormal result is not flushed);
* fp32 2**-130 * 0.5 must be nonzero (a subnormal operand is not treated as zero, nor the subnormal product).

These are read back as integer bit patterns, so the read-back itself cannot be flushed. Cost: about 2 µs.
:func:`check_no_flush_to_zero` is the refusal every computing entry point applies (semantics.md (e), last
paragraph; :mod:`mmaemu.plan.flush` gives it to the plan).
"""

from __future__ import annotations

import platform

import numpy as np

from ..errors import MmaemuError

__all__ = ["fp32_subnormals_flushed", "check_no_flush_to_zero"]

_THREE_MIN_SUBNORMALS_F64 = np.array([3.0 * 2.0**-149], np.float64)  # a normal float64
_SUBNORMAL_F32 = np.array([1 << 19], np.int32).view(np.float32)  # 2**-130 = 2**19 * 2**-149
for _probe in (_THREE_MIN_SUBNORMALS_F64, _SUBNORMAL_F32):
    _probe.setflags(write=False)


# On x86-64 and AArch64 one control register bit each decides flush-to-zero and denormals-are-zero for every
# floating-point width and instruction set (x86 MXCSR FTZ/DAZ for SSE/AVX, of which CPython's float64 arithmetic is
# made; AArch64 FPCR.FZ for scalar and Advanced SIMD), so two Python float64 multiplications probe the mode in a
# tenth of the time of the numpy probes (0.1 against 1.9 us, docs/performance.md). Elsewhere (32-bit ARM, whose
# NEON flushes fp32 whatever the mode, x87 builds) the numpy fp32 probes decide.
_UNIFORM_MODE = platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64")
_SMALLEST_NORMAL_F64 = 2.0**-1022  # halved: a subnormal result (FTZ flushes it)
_SUBNORMAL_F64 = 3 * 2.0**-1074  # a subnormal operand (DAZ reads it as zero)
_HALF, _ONE = 0.5, 1.0


def fp32_subnormals_flushed() -> bool:
    """True when this thread flushes fp32 subnormal results or treats subnormal operands as zero."""
    if _UNIFORM_MODE:
        return _SMALLEST_NORMAL_F64 * _HALF == 0.0 or _SUBNORMAL_F64 * _ONE == 0.0
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

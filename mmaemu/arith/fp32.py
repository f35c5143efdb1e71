"""Exact fp32 primitives of the offset formulation (:mod:`.offset`): bit casts and a fused multiply-add that
rounds toward zero.

* :func:`float32_bits` / :func:`float32_from_bits` reinterpret an fp32 and an int32 (LLVM ``bitcast``: no
  arithmetic, the same on every target).
* :func:`fma_toward_zero` is IEEE 754 ``fusedMultiplyAdd(a, b, c)`` rounded toward zero: the exact value
  ``a * b + c`` rounded once to fp32, toward zero. A correctly rounded operation, so its result is fixed by
  the standard and does not depend on the GPU. On CUDA devices it is the hardware instruction
  (``fma.rz.f32`` through libdevice's ``__nv_fmaf_rz``, registered by :mod:`mmaemu.cuda.shim`); everywhere
  else (CPU loops, the CUDA simulator) :func:`fma_toward_zero_exact` computes the same bits with float64
  arithmetic. ``tests/test_fp32.py`` checks the emulation against exact rational arithmetic.

Domain of the emulation: finite a, b, c whose result does not overflow fp32 (every use in mmaemu stays far
below 2**127). A zero result takes the sign IEEE gives round-toward-zero: ``x + (-x) = +0``.
"""

import numpy as np
from numba import types
from numba.core.extending import intrinsic, overload

from ..base._jit import arithmetic

FP32_FRACTION_BITS = 23
FP32_EXPONENT_BIAS = 127


def _bitcast(source, target, doc):
    """An intrinsic that reinterprets the bits of a ``source`` value as a ``target`` value (LLVM ``bitcast``)."""

    @intrinsic
    def cast(typingctx, x):
        if x != source:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(target))

        return target(source), codegen

    cast.__doc__ = doc
    return cast


float32_bits = _bitcast(types.float32, types.int32, "The int32 holding the bits of the float32 x.")
float32_from_bits = _bitcast(types.int32, types.float32, "The float32 whose bits are the int32 ``bits``.")


@arithmetic
def truncate_significand(x, bits_kept):
    """A normal or zero float32 x truncated toward zero to ``bits_kept`` (1 to 24) significant bits: the low
    mantissa bits are cleared (fp32 is sign-magnitude, so this is a truncation of |x|)."""
    mask = np.int32(-1) << np.int32(24 - bits_kept)
    return float32_from_bits(np.int32(float32_bits(x) & mask))


def fma_toward_zero_exact(a, b, c):
    """``fma_toward_zero`` in float64 arithmetic (compiled for the CPU and run by the CUDA simulator).

    ``p = a * b`` is exact in float64 (24 + 24 significant bits), ``s = RN(p + c)`` and its rounding error
    ``err`` (TwoSum, exact) give the exact sum ``s + err``. Let z be the fp32 next to it toward zero and z' the
    fp32 next to z away from zero; rounding is monotone, so z <= |s| <= z' in magnitude and ``r = RN32(s)`` is
    z or z'. ``r - s`` is exact (two floats within a factor of 2 of each other) and the sign of
    ``(r - s) - err`` is that of ``r - (p + c)`` (a float subtraction is zero only when exact). If r lies
    beyond the exact sum (away from zero) it is z', and one step toward zero gives z.
    """
    p = np.float64(a) * np.float64(b)
    q = np.float64(c)
    s = p + q
    v = s - p
    err = (p - (s - v)) + (q - v)
    r = np.float32(s)
    beyond = (np.float64(r) - s) - err
    if (s > 0.0 and beyond > 0.0) or (s < 0.0 and beyond < 0.0):
        r = np.nextafter(r, np.float32(0.0))
    return r


def float32_fma(exact, name, doc):
    """A float32 fused multiply-add named ``name``, emulated by ``exact`` (a plain function of three float32s).

    Called from Python it casts its arguments to float32 and runs ``exact``; in compiled code its ``generic``
    overload (every target without one of its own: the CPU loops, the CUDA simulator) compiles ``exact`` for three
    float32s. :mod:`mmaemu.cuda` gives it a ``cuda`` overload, the GPU's own instruction of the same rounding.
    """

    def fma(a, b, c):
        return exact(np.float32(a), np.float32(b), np.float32(c))

    @overload(fma, target="generic")
    def _generic(a, b, c):
        if (a, b, c) != (types.float32,) * 3:
            return None
        return exact

    fma.__name__ = fma.__qualname__ = name
    fma.__module__, fma.__doc__ = exact.__module__, doc
    return fma


fma_toward_zero = float32_fma(fma_toward_zero_exact, "fma_toward_zero",
                              "float32 ``a * b + c`` rounded once, toward zero (IEEE fusedMultiplyAdd, "
                              "roundTowardZero).")

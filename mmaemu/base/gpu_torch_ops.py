"""The torch operations whose CUDA kernels give other bits than their CPU kernels, computed as the GPU computes them.

The casts mmaemu models (DeepGEMM's helpers, torchao's NVFP4 and row-wise scales) are eager torch expressions that
run on the reference GPU. Most of their operations are correctly rounded IEEE operations, exact reductions or bit
manipulations, which torch's CPU and CUDA kernels compute alike (docs/semantics.md, section 13, lists every
operation checked). Two kinds differ, and the casts compute them here, as CUDA does, whatever device the input is
on:

* **A tensor divided by a Python number** (or a one-element CPU tensor). torch's CUDA kernel multiplies by the
  reciprocal: ``inv_b = opmath(1) / b`` once on the host, then ``a * inv_b`` per element (pytorch/pytorch
  ``aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu`` at commit 0f57f050df0e969d03e76495ace7ea90ba2b05d8,
  ``div_true_kernel_cuda``, the ``iter.is_cpu_scalar(2)`` branch; opmath is fp32 for fp32 tensors). The CPU
  kernel divides (correctly rounded), which differs by an ulp for many quotients (:func:`divide_by_number`).
  A Python number divided by a tensor is ``tensor.reciprocal() * number`` on every device (``Tensor.__rtruediv__``
  in ``torch/_tensor.py``), and a tensor divided by a tensor is a true division on CUDA too.
* **A power of two from a floating log2**: ``2 ** ceil(log2 x)`` (DeepGEMM v2.1.1.post3's ``ceil_to_ue8m0``) and
  ``exp2(floor(log2 x))`` (torchao's ``_round_scale_down_to_power_of_2``). CUDA's ``log2f`` is accurate to 1 ulp
  (CUDA C++ Programming Guide, "Mathematical Functions", single precision), not correctly rounded, and torch's CPU
  ``log2`` is another 1-ulp function (SLEEF's ``u10``): where log2 x lies within a few fp32 ulps of an integer,
  the rounding decides the power of two, and neither device's choice there is public. Everywhere else the result
  is the exact power of two, which :func:`power_of_two_ceil` and :func:`power_of_two_floor` compute from the bits
  (exact powers of two are their own results: log2 of 2**k is k exactly, and ``pow(2, k)`` / ``exp2(k)`` of an
  integer k are exact powers of two; modelled, docs/limitations.md names the GPU probe); inside the window they
  raise :class:`~mmaemu.errors.UnsupportedFeatureError`. Scales computed from bf16 or fp16 values never fall in
  it (the casts' tests check every bf16 amax).
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedFeatureError

__all__ = ["reciprocal_of_number", "divide_by_number", "power_of_two_ceil", "power_of_two_floor",
           "LOG2_WINDOW_ULPS"]

#: Half-width of the refused window around an integer log2, in fp32 ulps of that integer (CUDA's bound is 1).
LOG2_WINDOW_ULPS = 2
_FP32_FRACTION_BITS = 23


def reciprocal_of_number(divisor) -> np.float32:
    """``fp32(1) / fp32(divisor)``: the multiplier torch's CUDA kernel computes on the host for ``t / divisor``
    (one correctly rounded fp32 division; the divisor is first read as fp32)."""
    with np.errstate(all="ignore"):
        return np.float32(1.0) / np.float32(divisor)


def divide_by_number(values, divisor):
    """``values / divisor`` (a Python number) as torch's CUDA kernel computes it for fp32 values:
    ``values * fp32(1 / divisor)``, one IEEE fp32 multiplication per element.

    ``values``: a float32 numpy array or scalar (the result is float32) or an fp32 torch tensor (the result is a
    tensor on its device; multiplying by a Python number that is an exact fp32 value is one fp32 multiplication on
    torch's CPU and CUDA kernels alike).
    """
    inverse = reciprocal_of_number(divisor)
    if type(values).__module__.startswith("torch"):
        import torch

        if values.dtype != torch.float32:
            raise TypeError(f"divide_by_number models fp32 tensors (opmath fp32); got {values.dtype}")
        return values * float(inverse)
    with np.errstate(all="ignore"):
        return np.asarray(values, np.float32) * inverse


def _binade(magnitude):
    """(significand in [1, 2), exponent k) of positive finite fp32 values, subnormals included (exact)."""
    mantissa, exponent = np.frexp(magnitude.astype(np.float64))
    return mantissa * 2.0, exponent.astype(np.int64) - 1


def _window(integer):
    """Half-width of the refused window around log2 = integer: LOG2_WINDOW_ULPS fp32 ulps of |integer| (0 at 0,
    where fp32 resolves every log2 of a normal significand)."""
    magnitude = np.abs(integer).astype(np.float64)
    width = np.zeros(magnitude.shape)
    nonzero = magnitude > 0
    binade = np.floor(np.log2(magnitude[nonzero])).astype(np.int64)
    width[nonzero] = LOG2_WINDOW_ULPS * np.ldexp(1.0, binade - _FP32_FRACTION_BITS)
    return width


def _refuse(values, ambiguous, rule, way_out):
    if np.any(ambiguous):
        first = float(values[ambiguous][0])
        raise UnsupportedFeatureError(
            f"{rule}: log2 of {first!r} (0x{np.float32(first).view(np.uint32):08X}) lies within "
            f"{LOG2_WINDOW_ULPS} fp32 ulps of an integer, where the power of two depends on how the GPU's log2 "
            f"rounds (CUDA's log2f is accurate to 1 ulp, not correctly rounded) and mmaemu has no evidence of "
            f"it ({int(np.count_nonzero(ambiguous))} value(s)); {way_out}")


def _power_of_two(exponent):
    """fp32 2**exponent (exact down to 2**-149; +Inf above 2**127)."""
    with np.errstate(over="ignore"):
        return np.ldexp(np.float64(1.0), exponent).astype(np.float32)


def power_of_two_ceil(values, *, rule, way_out) -> np.ndarray:
    """``2 ** ceil(log2 |v|)`` of fp32 values as fp32: exact powers of two unchanged, 0 for ±0, +Inf for ±Inf
    and above 2**127, NaN for NaN; a value whose log2 lies just above an integer (within the window) raises
    :class:`UnsupportedFeatureError` naming ``rule`` and ``way_out``."""
    magnitude = np.abs(np.asarray(values, np.float32))
    result = magnitude.copy()  # 0, Inf and NaN are their own results
    regular = np.isfinite(magnitude) & (magnitude > 0)
    significand, k = _binade(magnitude[regular])
    inexact = significand > 1.0
    ambiguous = inexact & (np.log2(significand) <= _window(k))
    _refuse(magnitude[regular], ambiguous, rule, way_out)
    result[regular] = _power_of_two(np.where(inexact, k + 1, k))
    return result


def power_of_two_floor(values, *, rule, way_out) -> np.ndarray:
    """``exp2(floor(log2 v))`` of fp32 values as fp32: exact powers of two unchanged, 0 for +0 and -0, +Inf for
    +Inf, NaN for NaN and negative values; a value whose log2 lies just below an integer (within the window) raises
    :class:`UnsupportedFeatureError` naming ``rule`` and ``way_out``."""
    values = np.asarray(values, np.float32)
    result = np.where(values < 0, np.float32(np.nan), np.abs(values)).astype(np.float32)
    regular = np.isfinite(values) & (values > 0)
    significand, k = _binade(values[regular])
    ambiguous = (significand > 1.0) & (1.0 - np.log2(significand) <= _window(k + 1))
    _refuse(values[regular], ambiguous, rule, way_out)
    result[regular] = _power_of_two(k)
    return result

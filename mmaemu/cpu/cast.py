"""The per-tensor FP8 cast of :func:`mmaemu.quantize.quantize` and the amax of :func:`mmaemu.quantize.compute_amax`
as compiled loops, for tensors on the CPU.

Per element (the module docstring of :mod:`mmaemu.quantize`): ``y = fp32(x) * s``, one IEEE fp32 multiplication
(numba multiplies two float32 values in float32), then the saturating round to nearest even of
:func:`mmaemu.arith.epilogue.fp8_bits` (clamp to the format's largest value, +-Inf included, RNE with gradual
underflow, NaN -> 0x7F): the same rule as the epilogue's FP8 outputs, so one function owns it. The torch-operation
version (``quantize._round_to_fp8``) stays for tensors on a GPU; ``tests/test_quantize.py`` checks the two against
each other on random and adversarial inputs.

The amax is ``max |x|`` with NaN ignored (0 when every element is NaN), computed on the fp32 bit patterns: for
non-negative floats the order of the patterns ``bits & 0x7FFFFFFF`` is the order of the values (+-0 both give
+0, subnormals and Inf included), NaN patterns are the ones above Inf's (0x7F800000) and count as 0. An integer
maximum is associative, so LLVM vectorises the loop (a float ``max`` that must ignore NaN is not). One pass over
the values replaces torch's four (``abs``, ``isnan``, ``where``, ``max``) and their two temporaries; the result is
the same value (``tests/test_quantize.py``).

The row-wise cast of :func:`mmaemu.quantize.quantize_rowwise` (torchao's) takes the same per-element rule with one
scale per row (:func:`quantize_rows_fp8`), and its rows' amax (:func:`row_magnitudes`) is the largest magnitude
pattern of each row with NaN patterns counted (torch's ``amax`` propagates NaN: the caller then takes torch's
operations).

The loops index views from 0 (``values[lo:hi]``), not ``values[i]`` for i in ``range(lo, hi)``: a signed index
that may be negative makes Numba wrap it per element, which LLVM then turns into gathers and byte-wise stores
(measured: 1.44 ns per element for the cast that way, 0.35 ns with the views; docs/performance.md, "MiniLM's
profile").
"""

from __future__ import annotations

import numpy as np

from ..base._jit import arithmetic
from ..arith.epilogue import E4M3_LARGEST, E5M2_LARGEST, fp8_bits
from ..arith.fp32 import float32_from_bits
from ..arith.rounding import E4M3, E5M2
from . import threads

__all__ = ["quantize_fp8", "amax_fp32", "row_magnitudes", "quantize_rows_fp8", "current_scaling_fp8",
           "fits_one_pass", "token_strips_fp8", "rowwise_scales", "cleared_fractions", "rowwise_cast_rows"]

#: Cost of one element in the fast path's products (:mod:`.threads`, about 0.1 ns each): a multiplication and the
#: rounding's selects, vectorised: 0.35 ns measured (docs/performance.md, "MiniLM's profile").
CAST_WORK = 4
#: Cost of one element of the amax (a load, a mask, a compare, a select, a maximum, vectorised): 0.08 ns measured,
#: under one product.
AMAX_WORK = 1
#: fp32 bits of +Inf: the largest magnitude pattern that is not a NaN.
_INF_BITS = 0x7F800000
#: The largest finite fp32 value: TE's current scale where ``fp8_max / amax`` overflows.
_FLT_MAX = np.float32(np.finfo(np.float32).max)


@arithmetic
def quantize_span(lo, hi, values, scale, e5m2, codes):
    """``codes[i]`` = FP8 code of ``values[i] * scale`` (float32 values and scale) for i in lo .. hi-1; one loop per
    format, each free of branches (vectorised)."""
    span, out = values[lo:hi], codes[lo:hi]
    if e5m2:
        for i in range(span.size):
            out[i] = fp8_bits(span[i] * scale, 1.0, False, E5M2, E5M2_LARGEST)
    else:
        for i in range(span.size):
            out[i] = fp8_bits(span[i] * scale, 1.0, False, E4M3, E4M3_LARGEST)


@arithmetic
def amax_span(lo, hi, bits, partial, slot):
    """``partial[slot]`` = the largest magnitude pattern (fp32 bits, NaN counted as 0) of ``bits[lo:hi]`` (the int32
    view of float32 values): one task of :func:`amax_fp32`."""
    span = bits[lo:hi]
    largest = np.int32(0)
    for i in range(span.size):
        magnitude = span[i] & np.int32(0x7FFFFFFF)
        magnitude = magnitude if magnitude <= _INF_BITS else np.int32(0)
        largest = max(largest, magnitude)
    partial[slot] = largest


@arithmetic
def row_magnitude_span(lo, hi, bits, largest):
    """``largest[m]`` = the largest magnitude pattern ``bits[m, k] & 0x7FFFFFFF`` of each row m in lo .. hi-1 of
    ``bits`` [M, K] (the int32 view of float32 values), NaN patterns included (they lie above Inf's): one task of
    :func:`row_magnitudes`."""
    for m in range(lo, hi):
        row = bits[m]
        top = np.int32(0)
        for k in range(row.size):
            top = max(top, row[k] & np.int32(0x7FFFFFFF))
        largest[m] = top


@arithmetic
def quantize_rows_span(lo, hi, values, scales, e5m2, codes):
    """Rows lo .. hi-1 of :func:`quantize_rows_fp8`: :func:`quantize_span` of each row with its own scale."""
    K = values.shape[1]
    for m in range(lo, hi):
        quantize_span(0, K, values[m], scales[m], e5m2, codes[m])


@arithmetic
def rowwise_scales(largest, fp8_max, floor, scales):
    """``scales[m]`` (float32) = torchao's row-wise scale of a row whose finite amax has the fp32 bits
    ``largest[m]`` (:func:`row_magnitudes`): ``fp32(reciprocal(max(fp64(amax), floor)) * fp8_max)``, the float64
    operations torch computes for ``fp8_max / clamp(amax64, min=floor)`` (``Tensor.__rtruediv__``: a correctly
    rounded reciprocal, a correctly rounded product, then the round to fp32; :func:`mmaemu.quantize.rowwise_scale`).
    ``fp8_max``, ``floor``: float64 (the format's largest value, torchao's EPS)."""
    for m in range(largest.size):
        amax = max(np.float64(float32_from_bits(np.int32(largest[m]))), floor)
        scales[m] = np.float32((1.0 / amax) * fp8_max)


#: fp32 fraction fields below this are far from :func:`mmaemu.base.gpu_torch_ops.power_of_two_floor`'s refused
#: window (:func:`mmaemu.quantize._power_of_two_scales` says why).
BELOW_REFUSED_FRACTION = 0x7FF000


@arithmetic
def cleared_fractions(scales):
    """torchao's ``exp2(floor(log2(s)))`` of the float32 ``scales`` (flat) in place where every scale is a normal
    positive fp32 value whose fraction field is below :data:`BELOW_REFUSED_FRACTION`: each scale's fraction
    cleared (its binade's power of two), and True; else False and nothing changed (the caller takes
    :func:`mmaemu.base.gpu_torch_ops.power_of_two_floor`)."""
    bits = scales.view(np.uint32)
    for i in range(bits.size):
        exponent, fraction = bits[i] >> np.uint32(23), bits[i] & np.uint32(0x7FFFFF)
        if exponent == 0 or exponent >= 255 or fraction >= BELOW_REFUSED_FRACTION:  # a sign bit gives >= 256
            return False
    for i in range(bits.size):
        bits[i] &= np.uint32(0x7F800000)
    return True


@arithmetic
def rowwise_cast_rows(values, fp8_max, floor, e5m2, codes, scales, inverses):
    """torchao's row-wise cast (:func:`mmaemu.quantize.quantize_rowwise` with power-of-two scales) of the
    C-contiguous float32 ``values`` [M, K] in one compiled call, for a few rows (a decoding step, on the calling
    thread): True and ``codes`` [M, K] (uint8), ``scales`` [M] (float32) and ``inverses`` [M] (float32: the scales'
    fp32 reciprocals, the ``scale_a`` a row-wise ``scaled_mm`` takes, exact for powers of two); False where a row
    holds a NaN or an Inf or a scale is not cleared by :func:`cleared_fractions` (the caller takes
    :func:`mmaemu.quantize.quantize_rowwise`, whose torch operations handle them). The same steps as
    :func:`mmaemu.quantize.quantize_rowwise`'s compiled path: :func:`row_magnitude_span`, :func:`rowwise_scales`,
    :func:`cleared_fractions`, :func:`quantize_rows_span`."""
    M = values.shape[0]
    largest = np.zeros(M, np.int32)
    row_magnitude_span(0, M, values.view(np.int32), largest)
    for m in range(M):
        if largest[m] >= _INF_BITS:
            return False
    rowwise_scales(largest, fp8_max, floor, scales)
    if not cleared_fractions(scales):
        return False
    quantize_rows_span(0, M, values, scales, e5m2, codes)
    for m in range(M):
        inverses[m] = np.float32(np.float32(1.0) / scales[m])
    return True


def row_magnitudes(values: np.ndarray) -> np.ndarray:
    """int32 [M]: the largest magnitude pattern (fp32 bits, NaN patterns counted) of each row of the C-contiguous
    float32 array ``values`` [M, K]: a row's ``max |x|`` as fp32 bits where it is at most 0x7F800000 (Inf), a NaN
    pattern where the row holds a NaN."""
    M, K = values.shape
    largest = np.zeros(M, np.int32)
    threads.parallel_for(row_magnitude_span, M, max(1, K) * AMAX_WORK, values.view(np.int32), largest)
    return largest


def quantize_rows_fp8(values: np.ndarray, scales: np.ndarray, fmt: str) -> np.ndarray:
    """uint8 FP8 codes [M, K] (``fmt`` "e4m3" or "e5m2") of the C-contiguous float32 array ``values`` [M, K], each
    row times its fp32 scale ``scales[m]`` (float32 [M]): the per-element rule of :func:`quantize_fp8`."""
    M, K = values.shape
    codes = np.empty((M, K), np.uint8)
    threads.parallel_for(quantize_rows_span, M, max(1, K) * CAST_WORK, values, scales, fmt == "e5m2", codes)
    return codes


def quantize_fp8(values: np.ndarray, scale: np.float32, fmt: str) -> np.ndarray:
    """uint8 FP8 codes (``fmt`` "e4m3" or "e5m2") of the flat float32 array ``values`` times the fp32 ``scale``."""
    codes = np.empty(values.shape, np.uint8)
    threads.parallel_for(quantize_span, values.size, CAST_WORK, values, np.float32(scale), fmt == "e5m2", codes)
    return codes


def amax_fp32(values: np.ndarray) -> np.float32:
    """``max |values|`` of a flat, C-contiguous float32 array, NaN ignored; 0 for none or only NaN (module
    docstring)."""
    if values.size == 0:
        return np.float32(0.0)
    bits = values.view(np.int32)
    ranges = threads.job_ranges(values.size, AMAX_WORK, threads.num_threads())
    partial = np.zeros(len(ranges), np.int32)  # one slot per task
    if len(ranges) == 1:  # one task: on the calling thread
        amax_span(0, values.size, bits, partial, 0)
    else:
        threads.run_tasks([lambda lo=lo, hi=hi, slot=slot: amax_span(lo, hi, bits, partial, slot)
                           for slot, (lo, hi) in enumerate(ranges)])
    return partial.max().view(np.float32)


@arithmetic
def current_scaling_span(values, fp8_max, e5m2, codes, scales):
    """TE's current scaling of the flat float32 ``values`` in one call on the calling thread: their amax
    (:func:`amax_span`), the scale ``fp8_max / amax`` by :func:`mmaemu.quantize.scale_from_amax`'s rule "current"
    with epsilon 0 and no power of two (1 where amax is 0 or Inf; the largest fp32 value where the quotient
    overflows; one IEEE fp32 division), its inverse ``1 / scale`` (one IEEE fp32 division, TE's scale_inv), then
    :func:`quantize_span` of the values times the scale into ``codes``. ``scales`` (float32 [2]) receives
    (scale, scale_inv)."""
    partial = np.zeros(1, np.int32)
    amax_span(0, values.size, values.view(np.int32), partial, 0)
    amax = partial.view(np.float32)[0]  # never a NaN: NaN patterns count as 0
    scale = np.float32(1.0)
    if amax != np.float32(0.0) and amax != np.float32(np.inf):
        scale = np.float32(fp8_max / amax)
        if scale == np.float32(np.inf):
            scale = _FLT_MAX
    scales[0] = scale
    scales[1] = np.float32(np.float32(1.0) / scale)
    quantize_span(0, values.size, values, scale, e5m2, codes)


def fits_one_pass(size: int) -> bool:
    """Whether :func:`quantize_fp8` casts ``size`` elements as one task (on the calling thread), whatever the thread
    count: :func:`mmaemu.cpu.threads.jobs_per_task` gives a task at least MIN_TASK_WORK of work (here
    ``_ONE_PASS_SIZE`` elements) and spreads fewer jobs than that over no more tasks. Then
    :func:`current_scaling_fp8` computes the amax, the scales and the cast in one compiled call, with nothing given
    up to parallelism (the amax, at AMAX_WORK per element, is one task up to a larger size still)."""
    return size <= _ONE_PASS_SIZE


#: The most elements :func:`quantize_fp8` casts in one task (:func:`fits_one_pass`).
_ONE_PASS_SIZE = -(-threads.MIN_TASK_WORK // CAST_WORK)


def current_scaling_fp8(values: np.ndarray, fmt: str):
    """(uint8 FP8 codes of the flat float32 ``values``, float32 [2]: the scale and its inverse) of TE's current
    scaling (:func:`current_scaling_span`, one compiled call): the bits of :func:`amax_fp32`, then
    :func:`mmaemu.quantize.scale_from_amax` (recipe "current") and :func:`mmaemu.quantize.scale_inv`, then
    :func:`quantize_fp8` (``tests/test_quantize.py``). For ``values`` of at least one element; any size computes on
    the calling thread (:func:`fits_one_pass` says where nothing is lost by that)."""
    codes = np.empty(values.shape, np.uint8)
    scales = np.empty(2, np.float32)
    largest = np.float32(E5M2_LARGEST if fmt == "e5m2" else E4M3_LARGEST)  # the scale's fp8_max
    current_scaling_span(values, largest, fmt == "e5m2", codes, scales)
    return codes, scales


@arithmetic
def token_strips_fp8(values, strip, floor, inverse_max, codes, scales):
    """DeepGEMM's ``per_token_cast_to_fp8(x, use_ue8m0=False)`` (:mod:`mmaemu.deepgemm.utils`, the torch operations
    it follows) of the float32 ``values`` [M, K] (x widened exactly to fp32), one scale per strip of ``strip`` k of
    each row: ``codes`` [M, K] (uint8 E4M3) and ``scales`` [M, ceil(K / strip)] (float32). Per strip, in fp32:
    ``amax = max |x|`` (NaN propagating, as torch's ``amax``: read on the bit patterns, where a NaN's magnitude lies
    above Inf's), ``clamp(amax, floor)`` (NaN passes; ``floor`` = fp32(1e-4)), ``sf = amax * inverse_max`` (one fp32
    multiplication by fp32(1 / 448): the CUDA kernel's division by a number), ``1 / sf`` (correctly rounded), then
    each ``x * (1 / sf)`` by :func:`mmaemu.arith.epilogue.fp8_bits` (round to nearest even; finite products stay
    at most 448 (1 + 2**-21), where saturating and torch's cast agree). A NaN code is 0x7F whatever its sign (torch
    keeps the sign: both are NaN codes, which make their row's outputs NaN alike)."""
    M, K = values.shape
    bits = values.view(np.int32)
    for m in range(M):
        for s in range((K + strip - 1) // strip):
            k0, k1 = s * strip, min(s * strip + strip, K)
            largest = np.int32(0)
            for k in range(k0, k1):
                largest = max(largest, bits[m, k] & np.int32(0x7FFFFFFF))
            amax = float32_from_bits(np.int32(largest))
            amax = floor if amax < floor else amax
            sf = np.float32(amax * inverse_max)
            inverse = np.float32(np.float32(1.0) / sf)
            scales[m, s] = sf
            for k in range(k0, k1):
                codes[m, k] = fp8_bits(values[m, k] * inverse, 1.0, False, E4M3, E4M3_LARGEST)

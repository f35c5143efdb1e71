"""The epilogue of torch's CUTLASS row-wise kernel ``f8f8bf16_rowwise`` (torch 2.7.1, sm_90; docs/semantics.md,
section "Row-wise scaling").

Per output, from the fp32 accumulator ``acc``, the two per-output scales in the order the kernel applies them
(``first`` is applied to the accumulator, ``second`` to that product) and the bias widened to fp32:

1. ``p = RN_fp32(first * acc)``;
2. ``q = RN_fp32(second * p)``;
3. ``y = RN_fp32(bias + q)`` (no bias: ``bias = +0``, so a -0 result becomes +0);
4. the bf16 output is ``RN_bf16(y)``, NaN canonical (0x7FFF).

Each step is one IEEE fp32 operation rounded to nearest (CUTLASS ``Sm90Compute`` nodes ``multiplies`` and
``plus`` with ``round_to_nearest``; no fused multiply-add). Which scale is ``first`` depends on the shape
(:mod:`mmaemu.platform.rowwise`). Each step is computed as one float64 operation on fp32 values and one float64 ->
fp32 conversion (the processor's IEEE convertFormat: RNE, gradual underflow, overflow to +-Inf, NaN stays NaN):
the product of two fp32 values is exact in float64 (at most 48 significant bits, exponents far inside float64's
range), so its conversion is the one RNE rounding of the exact product; a sum of two fp32 values rounded to
float64 and then to fp32 is the correctly rounded fp32 sum, because 53 >= 2 * 24 + 2 (double rounding is
innocuous for addition at that precision), and a float64 sum of two fp32 values is zero only when exact, with
IEEE's sign of zero (-0 + -0 = -0, x + (-x) = +0). The conversions need gradual underflow: mmaemu refuses to
compute on a thread that flushes fp32 subnormals (:mod:`mmaemu.base.fpmode`), as the tensor-wise epilogue
(:mod:`.epilogue`) does. No branch on a value: the loop of :func:`rowwise_epilogue_span` vectorises.
"""

import numpy as np

from ..base._jit import arithmetic
from .epilogue import OUT_BFLOAT16, output_bits
from .rounding import value_of_bits


@arithmetic
def rowwise_scaled(acc, first, second):
    """``RN_fp32(second * RN_fp32(first * acc))`` as a float32 (steps 1-2; Inf * 0 -> NaN): ``acc``, ``first``
    and ``second`` fp32 values (float32, or float64 holding one); each float64 product is exact, its conversion
    to float32 the one rounding (module docstring)."""
    p = np.float32(np.float64(first) * np.float64(acc))
    return np.float32(np.float64(second) * np.float64(p))


@arithmetic
def rowwise_bias_add(bias, q):
    """``RN_fp32(bias + q)`` as a float32 (step 3): -0 + -0 = -0, x + (-x) = +0, Inf - Inf = NaN (``bias`` and
    ``q`` fp32 values; the float64 sum rounded to fp32 is the correctly rounded fp32 sum, module docstring)."""
    return np.float32(np.float64(bias) + np.float64(q))


@arithmetic
def rowwise_epilogue_one(acc, first, second, bias):
    """bf16 output bits of one accumulator value (steps 1-4); ``first``, ``second``, ``bias`` fp32 values (float32,
    or float64 holding one)."""
    return output_bits(rowwise_bias_add(bias, rowwise_scaled(acc, first, second)), OUT_BFLOAT16, 1.0, False)


@arithmetic
def rowwise_epilogue_rows(lo, hi, acc, x_scale, w_scale, bias, x_first, out_bits):
    """``out_bits[m, n]`` of rows lo .. hi-1 of ``acc`` [M, N] (fp32): ``x_scale`` [M], ``w_scale`` [N] and
    ``bias`` [N] fp32 values (float32 or float64 arrays; no bias: zeros, the kernel adds +0); ``x_first``: the
    kernel multiplies by x_scale[m] first (else w_scale[n]). :func:`rowwise_epilogue_span` per row."""
    N = acc.shape[1]
    for m in range(lo, hi):
        rowwise_epilogue_span(acc[m], out_bits[m], 0, N, x_scale[m], w_scale, bias, x_first)


@arithmetic
def rowwise_epilogue_span(acc, out_bits, lo, hi, x_scale, w_scale, bias, x_first):
    """``out_bits[n]`` for n in lo .. hi-1 of one row ``acc`` (fp32) of the output: ``x_scale``, the row's scale
    (an fp32 value); ``w_scale`` [N] the columns' and ``bias`` [N] the bias's (fp32 values, float32 or float64
    arrays; no bias: zeros, the kernel adds +0); ``x_first`` as in :func:`rowwise_epilogue_rows`.

    One loop per scale order, each indexing views of the span from 0 with no branch on a value (as
    :func:`mmaemu.arith.epilogue.epilogue_span`): LLVM vectorises it. Measured on this project's 2-core machine
    (64 x 5760 outputs, one thread): 0.55 ns per output, against 71 ns for the integer rounding and per-output
    decode of the scales' bits this function used before (docs/performance.md, "The row-wise recipe on the
    tensor-wise engines' path")."""
    values, out, w, b = acc[lo:hi], out_bits[lo:hi], w_scale[lo:hi], bias[lo:hi]
    if x_first:
        for i in range(values.size):
            out[i] = rowwise_epilogue_one(values[i], x_scale, w[i], b[i])
    else:
        for i in range(values.size):
            out[i] = rowwise_epilogue_one(values[i], w[i], x_scale, b[i])


@arithmetic
def exact_values(bits, fmt, out):
    """``out[i]`` = the exact float64 value of the bit pattern ``bits[i]`` (int64) in ``fmt`` (integer decoding:
    immune to a denormals-are-zero mode)."""
    for i in range(bits.shape[0]):
        out[i] = value_of_bits(bits[i], fmt)

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
(:mod:`mmaemu.platform.rowwise`). Values travel as float64 holding exact values: the product of two fp32 values
is exact in float64; a sum of two fp32 values rounded to float64 and then to fp32 is the correctly rounded fp32
sum, because 53 >= 2 * 24 + 2 (double rounding is innocuous for addition at that precision), and a float64 sum
of two fp32 values is zero only when exact, with IEEE's sign of zero.
"""

import numpy as np

from ..base._jit import arithmetic
from .epilogue import OUT_BFLOAT16, output_bits
from .rounding import BFLOAT16, FLOAT32, round_float32, value_of_bits


@arithmetic
def rowwise_scaled(acc, first, second):
    """``RN_fp32(second * RN_fp32(first * acc))`` as an exact float64 (steps 1-2; Inf * 0 -> NaN)."""
    return round_float32(second * round_float32(first * np.float64(acc)))


@arithmetic
def rowwise_bias_add(bias, q):
    """``RN_fp32(bias + q)`` as an exact float64 (step 3): -0 + -0 = -0, x + (-x) = +0, Inf - Inf = NaN."""
    return round_float32(bias + q)


@arithmetic
def rowwise_epilogue_one(acc, first, second, bias):
    """bf16 output bits of one accumulator value (steps 1-4); ``first``, ``second``, ``bias`` exact float64."""
    return output_bits(rowwise_bias_add(bias, rowwise_scaled(acc, first, second)), OUT_BFLOAT16, 1.0, False)


@arithmetic
def rowwise_epilogue_rows(lo, hi, acc, x_scale, w_scale, bias, x_first, out_bits):
    """``out_bits[m, n]`` of rows lo .. hi-1 of ``acc`` [M, N] (fp32): ``x_scale`` [M], ``w_scale`` [N] and
    ``bias`` [N] as exact float64; ``x_first``: the kernel multiplies by x_scale[m] first (else w_scale[n])."""
    N = acc.shape[1]
    for m in range(lo, hi):
        for n in range(N):
            if x_first:
                first, second = x_scale[m], w_scale[n]
            else:
                first, second = w_scale[n], x_scale[m]
            out_bits[m, n] = rowwise_epilogue_one(acc[m, n], first, second, bias[n])


@arithmetic
def rowwise_epilogue_span(acc, out_bits, lo, hi, x_scale_bits, w_scale_bits, bias_bits, x_first):
    """``out_bits[n]`` for n in lo .. hi-1 of one row ``acc`` (fp32) of the output: ``x_scale_bits``, the fp32
    bits of the row's scale; ``w_scale_bits`` [N] the columns' (uint32), ``bias_bits`` [N] the bias's bf16 bits
    (uint16; empty: no bias, the kernel adds +0); ``x_first`` as in :func:`rowwise_epilogue_rows`. The values are
    decoded from their bits (integer decoding: immune to a denormals-are-zero mode), as
    :func:`mmaemu.cpu.engine.rowwise_epilogue_codes` decodes them before :func:`rowwise_epilogue_rows`."""
    x_scale = value_of_bits(np.int64(x_scale_bits), FLOAT32)
    has_bias = bias_bits.shape[0] > 0
    for n in range(lo, hi):
        w_scale = value_of_bits(np.int64(w_scale_bits[n]), FLOAT32)
        bias = value_of_bits(np.int64(bias_bits[n]), BFLOAT16) if has_bias else 0.0
        if x_first:
            out_bits[n] = rowwise_epilogue_one(acc[n], x_scale, w_scale, bias)
        else:
            out_bits[n] = rowwise_epilogue_one(acc[n], w_scale, x_scale, bias)


@arithmetic
def exact_values(bits, fmt, out):
    """``out[i]`` = the exact float64 value of the bit pattern ``bits[i]`` (int64) in ``fmt`` (integer decoding:
    immune to a denormals-are-zero mode)."""
    for i in range(bits.shape[0]):
        out[i] = value_of_bits(bits[i], fmt)

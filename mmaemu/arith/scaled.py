"""The per-chunk scaled combine of block-wise FP8 GEMMs (DeepGEMM and cuBLASLt on sm_90; design note
scaling-recipes.md 1, 3).

An output's products are cut into chunks of ``chunk`` consecutive k (128: k = 0, 128, 256, ...; the last chunk
stops at K, the hardware's zero fill adds nothing), each a chain of the preset's blocks from +0
(:func:`mmaemu.arith.chain.chain_over_tiles`, the same chunk as a slow-accumulation restart). The chunks enter an
fp32 accumulator that starts at +0, in k order, by one combine step:

* :data:`COMBINE_ADD`: ``final = RN(final + partial)`` (slow accumulation, s = 1);
* :data:`COMBINE_SCALED_FMA`: ``s = RN(sa[kb] * sb[kb])``, then ``final = RN(s * partial + final)``, one fused
  multiply-add rounded once to nearest (DeepGEMM's ``final += (sa * sb) * partial``, contracted to FFMA by nvcc);
* :data:`COMBINE_FMA_SCALE_A_FIRST`: ``final = RN(RN(partial * sa[kb]) * sb[kb] + final)`` (cuBLASLt's block-wise
  kernels with 1x128 scales on A: 1x128 x 1x128 and 1x128 x 128x128);
* :data:`COMBINE_FMA_SCALE_B_FIRST`: ``final = RN(RN(partial * sb[kb]) * sa[kb] + final)`` (cuBLASLt's 128x128 x
  1x128). The two cuBLASLt rules are Transformer Engine's zero-tolerance reference of cuBLASLt
  (:data:`mmaemu.model.chunked.CUBLASLT_SOURCE`).

:func:`fma_nearest` is IEEE 754 ``fusedMultiplyAdd`` rounded to nearest, ties to even: on CUDA devices the
hardware ``fma.rn.f32`` (registered by :mod:`mmaemu.cuda.blockwise.kernel`), elsewhere :func:`fma_nearest_exact`, an
exact float64 emulation (``tests/test_blockwise.py`` checks it against rationals). Both are correctly rounded, so
their bits are fixed by the standard.
"""

import math

import numpy as np
from numba import types

from ..base._jit import arithmetic
from .chain import chain_over_tiles
from .epilogue import OUT_BFLOAT16, OUT_FLOAT32, output_bits
from .fp32 import _bitcast, float32_fma, float32_from_bits
from .special import FINITE, nonfinite_accumulator

COMBINE_ADD = 0
COMBINE_SCALED_FMA = 1
COMBINE_FMA_SCALE_A_FIRST = 2
COMBINE_FMA_SCALE_B_FIRST = 3
# How the accumulator becomes the output (chunked_output_bits): a mode is a sum of these flags.
OUTPUT_FP32_FLAG = 1  # the output dtype is fp32 (NaN 0x7FFFFFFF), else bf16 rounded to nearest even (NaN 0x7FFF)
OUTPUT_ADD_FLAG = 2  # y = RN(d + final) in fp32 before the cast (a widened bias; DeepGEMM's TMA reduce-add)
OUTPUT_ACCUMULATE_FLAG = 4  # after the cast, out = cast(RN(cast(y) + c)) in fp32 (cuBLASLt's beta = 1 as TE states it)
OUTPUT_BFLOAT16 = 0  # bf16 of final (DeepGEMM's __float22bfloat162_rn)
OUTPUT_FLOAT32 = OUTPUT_FP32_FLAG  # fp32 final as it is
OUTPUT_ADD_BFLOAT16 = OUTPUT_ADD_FLAG  # bf16 of RN(d + final)
OUTPUT_REDUCE_ADD_FP32 = OUTPUT_FP32_FLAG | OUTPUT_ADD_FLAG  # fp32 RN(d + final)

float64_bits = _bitcast(types.float64, types.int64, "The int64 holding the bits of the float64 x.")
float64_from_bits = _bitcast(types.int64, types.float64, "The float64 whose bits are the int64 ``bits``.")


def fma_nearest_exact(a, b, c):
    """float32 ``RN(a * b + c)`` in float64 arithmetic, for every float32 a, b, c (NaN, Inf, overflow included).

    Proof of exactness. ``p = a * b`` is exact in float64: 24 + 24 significant bits, and the exponent of the
    smallest product, 2**-298, is far above float64's normal range limit. ``s = RN64(p + c)`` and its error
    ``err`` by TwoSum (Knuth: exact for any floats whose sum does not overflow, which float32 inputs cannot) give
    the exact sum ``x = s + err``. If err != 0, x lies strictly between s and its float64 neighbour on err's side;
    of these two one has an odd significand, and that one is ``RO53(x)``, x rounded to odd at 53 bits (the
    truncation of x with the last bit forced to 1 if inexact). Rounding to odd at p bits followed by a rounding to
    nearest at q <= p - 2 bits equals the direct rounding to nearest of x (Boldo and Melquiond, "Emulation of FMA
    and correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 2008); 53 >= 24 + 2, and float32
    subnormal results sit on a coarser grid still, so ``float32(RO53(x))`` is ``RN32(x)``, overflow to Inf at the
    IEEE threshold included. An exact zero takes the sign RN gives (float64 follows the same rules). Non-finite
    inputs: the float64 operations are IEEE and give the IEEE result.
    """
    p = np.float64(a) * np.float64(b)
    q = np.float64(c)
    s = p + q
    if not math.isfinite(s):
        return np.float32(s)
    v = s - p
    err = (p - (s - v)) + (q - v)
    if err != 0.0:
        bits = float64_bits(s)
        if bits & 1 == 0:
            # s has an even significand: take its neighbour on the exact sum's side (one unit of magnitude
            # up if err points away from zero, down otherwise; float64 is sign-magnitude).
            bits += np.int64(1) if (err > 0.0) == (s > 0.0) else np.int64(-1)
            s = float64_from_bits(bits)
    return np.float32(s)


fma_nearest = float32_fma(fma_nearest_exact, "fma_nearest",
                          "float32 ``a * b + c`` rounded once, to nearest even (IEEE fusedMultiplyAdd, "
                          "roundTiesToEven).")


@arithmetic
def chunk_scale(scale_a, scale_b):
    """``s = RN(scale_a * scale_b)``, the fp32 product of the two fp32 scales of a chunk."""
    return np.float32(np.float32(scale_a) * np.float32(scale_b))


@arithmetic
def combine_chunk(rule, final, partial, scale_a, scale_b):
    """The accumulator after chunk ``partial`` enters it by ``rule`` (:data:`COMBINE_ADD`,
    :data:`COMBINE_SCALED_FMA`, :data:`COMBINE_FMA_SCALE_A_FIRST` or :data:`COMBINE_FMA_SCALE_B_FIRST`)."""
    if rule == COMBINE_ADD:
        return np.float32(final + partial)
    # the factors of the one fused multiply-add (a single call site: one fma.rn.f32 in a CUDA kernel)
    if rule == COMBINE_SCALED_FMA:
        x, y = chunk_scale(scale_a, scale_b), np.float32(partial)
    elif rule == COMBINE_FMA_SCALE_A_FIRST:
        x, y = np.float32(np.float32(partial) * np.float32(scale_a)), np.float32(scale_b)
    else:
        x, y = np.float32(np.float32(partial) * np.float32(scale_b)), np.float32(scale_a)
    return fma_nearest(x, y, np.float32(final))


@arithmetic
def chunk_partial(sa, ea, sb, eb, a_codes, b_codes, a_table, b_table, K, kb, chunk, params):
    """The fp32 result of chunk kb (k in [kb * chunk, min((kb + 1) * chunk, K))): one chain from +0, or the NaN/Inf
    rule's value (semantics.md c.4, applied to the chunk's own codes) where a code of the chunk is not finite."""
    k0 = kb * chunk
    k1 = min(k0 + chunk, K)
    bits = nonfinite_accumulator(a_codes[k0:k1], b_codes[k0:k1], a_table, b_table)
    if bits != FINITE:
        return float32_from_bits(np.int32(bits))
    return chain_over_tiles(sa, ea, sb, eb, K, kb, 1, 1, chunk, 0, params)


@arithmetic
def accumulate_chunked_one(sa, ea, sb, eb, a_codes, b_codes, a_table, b_table, K, scales_a, scales_b, chunk, rule,
                           params):
    """The fp32 accumulator of one output: every chunk from +0 (:func:`chunk_partial`), entered in k order by
    :func:`combine_chunk` into an accumulator that starts at +0.

    ``sa``/``ea``, ``sb``/``eb``: decoded row of A and row of B (int8 significands, int16 exponents); ``a_codes``/
    ``b_codes``: their FP8 codes, ``a_table``/``b_table`` the float64 values of the 256 codes; ``scales_a``/
    ``scales_b``: the fp32 scale of each chunk for this row of A and this row of B (ignored by COMBINE_ADD).
    """
    final = np.float32(0.0)
    for kb in range((K + chunk - 1) // chunk):
        partial = chunk_partial(sa, ea, sb, eb, a_codes, b_codes, a_table, b_table, K, kb, chunk, params)
        final = combine_chunk(rule, final, partial, scales_a[kb], scales_b[kb])
    return final


@arithmetic
def combine_chunk_rows(lo, hi, rule, final, partial, scales_a, scales_b, kb):
    """``final[m, n] = combine_chunk(rule, final[m, n], partial[m, n], scales_a[m, kb], scales_b[n, kb])`` for the
    rows lo .. hi-1 (the fast path's combine of one chunk of a whole GEMM)."""
    N = final.shape[1]
    for m in range(lo, hi):
        sa = scales_a[m, kb]
        for n in range(N):
            final[m, n] = combine_chunk(rule, final[m, n], partial[m, n], sa, scales_b[n, kb])


@arithmetic
def reduce_add(d, value):
    """``RN(d + value)`` in fp32: the reduce-add of a result into an fp32 output (DeepGEMM's TMA reduce-add)."""
    return np.float32(np.float32(d) + np.float32(value))


@arithmetic
def chunked_output_bits(mode, final, d_bits, c_bits):
    """The output bits of one accumulator ``final`` by ``mode`` (a sum of the OUTPUT_*_FLAG values): with
    OUTPUT_ADD_FLAG first ``y = RN(d + final)`` in fp32; then the cast to the output dtype (bf16 or fp32); with
    OUTPUT_ACCUMULATE_FLAG then ``cast(RN(cast(y) + c))``, the cast value widened exactly. d and c are fp32 values
    given by their int32 bits ``d_bits`` and ``c_bits``."""
    out_code = OUT_FLOAT32 if mode & OUTPUT_FP32_FLAG else OUT_BFLOAT16
    y = final
    if mode & OUTPUT_ADD_FLAG:
        y = reduce_add(float32_from_bits(np.int32(d_bits)), final)
    bits = np.int64(output_bits(np.float64(y), out_code, 1.0, False))
    if not mode & OUTPUT_ACCUMULATE_FLAG:
        return bits
    wide = bits if mode & OUTPUT_FP32_FLAG else bits << np.int64(16)  # bf16 -> fp32 is exact
    if wide >= np.int64(1) << np.int64(31):
        wide -= np.int64(1) << np.int64(32)  # the int32 holding the same 32 bits
    cast = float32_from_bits(np.int32(wide))
    return np.int64(output_bits(np.float64(reduce_add(cast, float32_from_bits(np.int32(c_bits)))), out_code, 1.0,
                                False))

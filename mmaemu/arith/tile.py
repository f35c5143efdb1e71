"""The arithmetic of semantics.md (b), (c), (d) for a tile of outputs at once: the fast formulation.

:mod:`.block`, :mod:`.chain` and :mod:`.schedule` walk ONE output's chains with integer significands; they are the
reference (``accumulate_one``). The functions here compute the same bits for a tile of ``rows x lanes`` outputs
(the ``rows`` rows of A given, the ``lanes`` columns of one panel of B) so that the innermost loops run over the
lanes with no data-dependent branch: LLVM turns them into AVX-512/AVX2 code on CPUs. Every step is one of the
steps of b.1/b.2 written for many outputs; where the formulation differs from the reference (products aligned by
an fp32 power-of-two multiplier instead of integer shifts, a clamped multiplier, int32/int16 lanes, branch-free
shifts) it is proven exact below.

Operand layout (built by :func:`mmaemu.cpu.gemm.decode_rows` and :func:`~mmaemu.cpu.gemm.decode_panel`):

* ``a_val[r, k]``, ``b_val[k, j]``: float32, the exact value of the code; 0 for zero, NaN and Inf codes (those
  are excluded terms of the finite path; c.4 is applied afterwards);
* ``a_exp[r, k]``, ``b_exp[k, j]``: int8, the alignment exponent ex (semantics.md (a)); :data:`TILE_ABSENT_EXP`
  for zero, NaN and Inf codes.

Per-output state, in arrays ``[rows, lanes]``: the accumulator ``c = c_sig * 2**(max(c_lead, -126) - frac_out)``
with ``c_lead = floor(log2|c|)`` (:data:`~.block.NO_LEAD` for +0) for the early presets, its fp32 value
``c_val`` for the late preset. ``c_sig`` and the block sums use the *lane* integer type T (the dtype of the
``total`` work array): int32 when ``nfma * 2**(frac+2) + 2**(frac+1) < 2**31`` (:func:`lane_bits_needed`),
int64 otherwise.

Exactness of the formulation
----------------------------

(1) Products on the grid (b.1 step 4) in fp32. With ``P = 2**(frac - E)`` the term of a product p is
    ``trunc(p / u) = trunc(p * P)``. It is computed as ``T((a * P) * b)`` (fptosi truncates toward zero).
    Both multiplications are exact: a, b and a*b have at most 4, 4 and 8 significant bits and P is a power of
    two (:func:`pow2_scale`, at least 2**-33 and at most 2**91), so each result is a power-of-two multiple of an
    exact value and stays in the normal range: ``|a * P|`` lies between 2**-16 * 2**-33 and 57344 * 2**91.
    Hence the result is exact and independent of the rounding mode and of flush-to-zero. It fits T: in a
    block with a nonzero product, ``|a*b*P| < 2**(ea+eb+2-E+frac) <= 2**(frac+2)`` (see (3)).
(2) ``P = pow2_scale(frac - E)`` is exact for -33 <= frac - E <= 91 and clamped outside. In the GEMM path every
    nonzero product is a multiple of 2**-32 and below 2**32 (57344**2 < 2**32), and so every accumulator is a
    multiple of 2**-32 (truncating a multiple of 2**-32 to a power-of-two grid keeps it one). A block with a
    nonzero product therefore has E >= -28, so ``frac - E <= 40 + 28 < 91``: the upper clamp only meets blocks
    without a nonzero product, whose terms are 0 for any finite P (the accumulator's term is an integer shift,
    see (3), and never uses P). When ``frac - E < -33`` every product p is below 2**32 <= 2**(E - frac - 1), so
    the reference truncates it to 0, and so does the clamped multiplier: ``|p * 2**-33| < 1``.
    (``pow2_float32``, exact on the whole normal range, converts the chain results to fp32.)
(3) Block sums in T. Each product term is below 2**(frac+2) in magnitude (a product lies below
    2**(e+2) <= 2**(E+2)) and the accumulator term below 2**(frac+1) (c < 2**(c_lead+1), c_lead <= E), so
    ``|S| < nfma * 2**(frac+2) + 2**(frac+1)``, the bound :func:`lane_bits_needed` checks for int32 (and the
    Preset checks for int64). Every partial sum is bounded by the same sum of magnitudes: no overflow.
    The accumulator term is an integer shift of ``c_sig`` (:func:`lane_shift_toward_zero`), exact.
(4) Normalisation (b.1 steps 5-6) is the reference's :func:`~.block.normalize` with ``drop`` applied as a
    right shift (truncating) or an exact left shift, so ``c_sig`` always has the reference's value; it keeps
    at most frac_out + 1 <= 24 bits, so ``float32(c_sig) * pow2_float32(max(c_lead, -126) - frac_out)`` is the
    exact fp32 value, +0 for c_sig = 0 (the exponent is at least -32 - 23 = -55, and |c| < K * 2**32 keeps it
    far below 127 for any K below 2**90).

Exponents: an absent code has exponent :data:`TILE_ABSENT_EXP` = -100, so a product with an absent factor has
an exponent sum <= -100 + 15 = -85, below every real exponent sum (>= -28) and below the leading exponent of
every nonzero accumulator (>= -32): it never sets E, exactly like the reference's ABSENT_EXP. A block whose
terms are all absent and whose c is +0 sums to 0 and yields +0 whatever E is (b.1 step 5).
"""

import numpy as np
from numba import types
from numba.cpython.unsafe.numbers import leading_zeros
from numba.core.extending import overload

from ..base._jit import arithmetic
from .block import NO_LEAD, RESULT_EXP_FLOOR
from .chain import chain_range, chain_range_count
from .fp32 import float32_from_bits
from .schedule import chain_tiles_of, clear_tile, combine_step, combine_tile, split_chains

# Exponent of zero, NaN and Inf codes in the tile layout (int8); see the module docstring.
TILE_ABSENT_EXP = -100
# The exponent maximum E is kept in int16 (32 lanes per AVX-512 vector): exponent sums of the tile layout lie in
# [-200, 30], leading exponents of nonzero accumulators in [-32, 127] (module docstring), min_exp in
# [-1000, 1000] (Preset), and EMAX_NONE stands for "no term" (c = +0) below all of them.
EMAX_NONE = -30000
# k indices handled per pass of the innermost lane loops (the rest of a block runs one k at a time).
K_UNROLL = 4


# Field layout of the FP8 formats for tile_decode: (mantissa bits, exponent bits, bias, emin, IEEE Inf/NaN field).
E4M3_TILE = (3, 4, 7, -6, 0)
E5M2_TILE = (2, 5, 15, -14, 1)
TILE_FORMATS = {"e4m3": E4M3_TILE, "e5m2": E5M2_TILE}


def lane_bits_needed(preset) -> int:
    """32 if every block sum of the preset fits an int32 lane (module docstring (3)), else 64."""
    bound = preset.nfma * 2 ** (preset.frac + 2) + 2 ** (preset.frac + 1)
    return 32 if bound < 2**31 else 64


@arithmetic
def pow2_float32(n):
    """Exactly 2**n as float32 for n clamped to [-126, 127] (the normal range), without a table or a division.

    The multiplications go upward from 2**-126 by the binary digits of n + 126, so every partial product is a
    normal power of two no larger than the result: all exact. Branch-free (selects), so it vectorises.
    """
    x = np.int32(min(max(n, -126), 127) + 126)
    p = np.float32(2.0**-126)
    p *= np.float32(2.0) if x & 1 else np.float32(1.0)
    p *= np.float32(4.0) if x & 2 else np.float32(1.0)
    p *= np.float32(16.0) if x & 4 else np.float32(1.0)
    p *= np.float32(256.0) if x & 8 else np.float32(1.0)
    p *= np.float32(65536.0) if x & 16 else np.float32(1.0)
    p *= np.float32(2.0**32) if x & 32 else np.float32(1.0)
    p *= np.float32(2.0**64) if x & 64 else np.float32(1.0)
    f = np.float32(2.0**64) if x & 128 else np.float32(1.0)  # 2**128 is not an fp32: two factors 2**64
    p *= f
    p *= f
    return p


@arithmetic
def tile_decode(code, fmt):
    """``(value, exponent)`` of an FP8 code in the tile layout (semantics.md (a)), branch-free.

    ``fmt`` = :data:`TILE_FORMATS` entry (a global constant tuple such as :data:`E4M3_TILE` lets LLVM fold the
    format and vectorise a loop of decodes: about 0.1 ns a code here, :func:`mmaemu.cpu.gemm.decode_coded_panel`).
    A normal code's fp32 bits are its magnitude bits moved to fp32's mantissa position with the exponent field
    rebiased by ``127 - bias`` (an exact reinterpretation: the field is at least 1, so the fp32 is normal) and its
    sign bit moved to bit 31; a subnormal code (field 0) is ``mant * 2**(emin - mbits)``, an exact product of a
    small integer and a normal power of two. The alignment exponent is ``ex = max(field, 1) - bias`` (emin for
    subnormals). Zero, NaN and Inf codes give (0, TILE_ABSENT_EXP).
    """
    mbits, ebits, bias, emin, ieee = fmt
    i32 = np.int32
    c = i32(code)
    mag = i32(c & i32(0x7F))
    field = i32(mag >> i32(mbits))
    mant = i32(mag & i32((1 << mbits) - 1))
    nonfinite = (field == i32((1 << ebits) - 1)) & ((ieee != 0) | (mant == i32((1 << mbits) - 1)))
    absent = (mag == i32(0)) | nonfinite
    sign = i32(i32(c & i32(0x80)) << i32(24))
    normal = float32_from_bits(i32(i32(i32(mag << i32(23 - mbits)) + i32((127 - bias) << 23)) | sign))
    sub = np.float32(mant) * pow2_float32(i32(emin - mbits))
    sub = np.float32(-sub) if sign != 0 else sub
    value = normal if field != i32(0) else sub
    value = np.float32(0.0) if absent else value
    ex = i32(TILE_ABSENT_EXP) if absent else i32(max(field, i32(1)) - i32(bias))
    return value, ex


def panel_value(x):
    """The fp32 value of an element of a panel of B: ``x`` itself (float32), or the bfloat16 ``x`` given by its
    bits (uint16; the narrow panels of :func:`narrow_panel_values`): exactly ``bits << 16`` reinterpreted, one
    shift. Compiled per element type (an overload), so one source serves both panels."""
    return np.float32(x)


@overload(panel_value, target="generic")
def _panel_value(x):
    if x == types.uint16:
        return lambda x: float32_from_bits(np.int32(np.int32(x) << np.int32(16)))
    return lambda x: x


def narrow_panel_values(val):
    """The bfloat16 bits (uint16) of decoded panel values ``val`` (float32, any shape), for panels read with
    :func:`panel_value`. Exact for every FP8 value (at most 4 significant bits, exponents -16 .. 15: bfloat16 has 8
    and fp32's exponent range), i.e. the low 16 bits of each fp32 are 0; raises ValueError otherwise."""
    bits = np.ascontiguousarray(val, np.float32).view(np.uint32)
    if np.any(bits & np.uint32(0xFFFF)):
        raise ValueError("panel values are not exact in bfloat16")
    return (bits >> np.uint32(16)).astype(np.uint16)


@arithmetic
def pow2_scale(n):
    """The block's product multiplier P = 2**n (n = frac - E) as float32: exact for -33 <= n <= 91, 2**-33 below
    and 2**91 above (module docstring (2) shows that the clamp never changes a term). Built from its fp32 bits
    (the biased exponent n + 127, a normal number on the whole clamped range): three int32 operations and a
    reinterpretation, in the lanes of n, where two int64 shifts and two conversions to fp32 ran before."""
    x = np.int32(min(max(n, np.int32(-33)), np.int32(91)) + np.int32(127))
    return float32_from_bits(np.int32(x << np.int32(23)))


@arithmetic
def lane_cap(T):
    """Largest shift of the lane type T: 31 for int32, 63 for int64 (folds to a constant)."""
    return 31 if T(4294967296) == 0 else 63


@arithmetic
def lane_shift_toward_zero(x, shift, T, cap):
    """``x * 2**shift`` truncated toward zero, in the lane type T (cap = :func:`lane_cap`), branch-free.

    A right shift of the ones' complement ``x + s`` (s = -1 for x < 0, else 0) is ``~(|x| >> d)``, so
    ``((x + s) >> d) - s = -(|x| >> d)``: the magnitude truncation of :func:`~.intbits.shift_toward_zero`.
    Shifts are clamped to cap; |x| < 2**cap, so a right shift by cap gives 0 as any longer one would. The
    caller guarantees that a left shift does not overflow T.
    """
    right = T(min(max(-shift, 0), cap) & cap)
    left = T(min(max(shift, 0), cap) & cap)
    s = T(x >> cap)
    return T(T(T(T(x + s) >> right) - s) << left)


@arithmetic
def lane_bit_length(x, T, cap):
    """Number of bits of a non-negative x of the lane type T (0 for 0), cf. :func:`~.intbits.bit_length`: the
    width of T less x's leading zero bits (``llvm.ctlz``, defined at 0, where it gives the width), which LLVM
    vectorises in the lane width (AVX-512CD ``vplzcntq`` in :func:`tile_normalize`'s int64 loop), where the binary
    search of six selects it replaces ran six compare-and-shift steps per lane."""
    return T(T(cap + 1) - leading_zeros(T(x)))


@arithmetic
def tile_exponent_max(a_exp, b_exp, kb, ke, e_max):
    """b.1 steps 1-2 for one row of the tile: ``e_max[j] = max(e_max[j], ex(a_k) + ex(b_kj))`` (int16).

    ``a_exp``: the row of A; k runs as an unsigned index (no negative-index wrap-around code in the loops).
    """
    lanes = e_max.shape[0]
    u = np.uint64
    k = u(kb)
    end = u(ke)
    while k + u(K_UNROLL) <= end:
        k1 = k + u(1)
        k2 = k + u(2)
        k3 = k + u(3)
        e0 = a_exp[k]
        e1 = a_exp[k1]
        e2 = a_exp[k2]
        e3 = a_exp[k3]
        for j in range(lanes):
            x0 = max(np.int16(e0 + b_exp[k, j]), np.int16(e1 + b_exp[k1, j]))
            x1 = max(np.int16(e2 + b_exp[k2, j]), np.int16(e3 + b_exp[k3, j]))
            e_max[j] = max(e_max[j], np.int16(max(x0, x1)))
        k += u(K_UNROLL)
    while k < end:
        e0 = a_exp[k]
        for j in range(lanes):
            e_max[j] = max(e_max[j], np.int16(e0 + b_exp[k, j]))
        k += u(1)


@arithmetic
def tile_product_sum(a_val, b_val, kb, ke, scale, total):
    """b.1 step 4 for one row: ``total[j] += sum_k trunc(a_k * b_kj * scale[j])`` (exact: docstring (1)).

    ``b_val``: float32 values, or their bfloat16 bits (uint16, :func:`panel_value`: 2 bytes a code to read instead
    of 4, for calls whose few rows of A make them wait on memory)."""
    T = total.dtype.type
    lanes = total.shape[0]
    u = np.uint64
    k = u(kb)
    end = u(ke)
    while k + u(K_UNROLL) <= end:
        k1 = k + u(1)
        k2 = k + u(2)
        k3 = k + u(3)
        a0 = a_val[k]
        a1 = a_val[k1]
        a2 = a_val[k2]
        a3 = a_val[k3]
        for j in range(lanes):
            p = scale[j]
            t0 = T(T((a0 * p) * panel_value(b_val[k, j])) + T((a1 * p) * panel_value(b_val[k1, j])))
            t1 = T(T((a2 * p) * panel_value(b_val[k2, j])) + T((a3 * p) * panel_value(b_val[k3, j])))
            total[j] = T(total[j] + T(t0 + t1))
        k += u(K_UNROLL)
    while k < end:
        a0 = a_val[k]
        for j in range(lanes):
            total[j] = T(total[j] + T((a0 * scale[j]) * panel_value(b_val[k, j])))
        k += u(1)


@arithmetic
def tile_normalize(total, e_max, r, frac, frac_out, c_sig, c_lead):
    """b.1 steps 5-6 for row r: the block sum ``total * 2**(E - frac)`` cut to frac_out + 1 significant bits.

    Same result as :func:`~.block.normalize`: ``c_sig * 2**(max(c_lead, -126) - frac_out)``; +0 when the
    truncated sum is 0 (c_sig = 0, c_lead = NO_LEAD).
    """
    T = total.dtype.type
    cap = lane_cap(T)
    lanes = total.shape[1]
    for j in range(lanes):
        grid = np.int32(e_max[r, j] - frac)
        s = total[r, j]
        lead = np.int32(grid + np.int32(lane_bit_length(T(abs(s)), T, cap)) - 1)
        drop = np.int32(max(lead, RESULT_EXP_FLOOR) - frac_out - grid)
        sig = lane_shift_toward_zero(s, np.int32(-drop), T, cap)
        c_sig[r, j] = sig
        c_lead[r, j] = lead if sig != 0 else NO_LEAD


@arithmetic
def tile_block_early(a_val, a_exp, b_val, b_exp, rows, kb, ke, params, c_sig, c_lead, e_max, scale, total):
    """One hopper/ada block step (b.1) over k in [kb, ke) for the tile; updates (c_sig, c_lead) in place."""
    frac, frac_out, min_exp = params.frac, params.frac_out, params.min_exp
    T = total.dtype.type
    cap = lane_cap(T)
    lanes = total.shape[1]
    for r in range(rows):
        for j in range(lanes):
            e_max[r, j] = max(c_lead[r, j], EMAX_NONE)  # the accumulator takes part in the alignment (step 2)
        tile_exponent_max(a_exp[r], b_exp, kb, ke, e_max[r])
        for j in range(lanes):
            e = np.int32(max(e_max[r, j], min_exp))
            e_max[r, j] = e
            scale[r, j] = pow2_scale(np.int32(frac - e))
            # trunc(c / u): c = c_sig * 2**(max(c_lead, -126) - frac_out), u = 2**(e - frac)
            shift = np.int32(max(c_lead[r, j], RESULT_EXP_FLOOR) - frac_out - e + frac)
            total[r, j] = lane_shift_toward_zero(c_sig[r, j], shift, T, cap)
        tile_product_sum(a_val[r], b_val, kb, ke, scale[r], total[r])
        tile_normalize(total, e_max, r, frac, frac_out, c_sig, c_lead)


@arithmetic
def tile_block_late(a_val, a_exp, b_val, b_exp, rows, kb, ke, params, c_val, c_sig, c_lead, e_max, scale, total):
    """One b200_mma_sync block (b.2): products aligned among themselves, then ``c = fp32(d + c)`` (RNE)."""
    frac, frac_out, min_exp = params.frac, params.frac_out, params.min_exp
    T = total.dtype.type
    lanes = total.shape[1]
    for r in range(rows):
        for j in range(lanes):
            e_max[r, j] = EMAX_NONE
        tile_exponent_max(a_exp[r], b_exp, kb, ke, e_max[r])
        for j in range(lanes):
            e = max(e_max[r, j], min_exp)
            e_max[r, j] = e
            scale[r, j] = pow2_scale(np.int32(frac - e))
            total[r, j] = T(0)
        tile_product_sum(a_val[r], b_val, kb, ke, scale[r], total[r])
        tile_normalize(total, e_max, r, frac, frac_out, c_sig, c_lead)
        for j in range(lanes):
            d = np.float32(c_sig[r, j]) * pow2_float32(max(c_lead[r, j], RESULT_EXP_FLOOR) - frac_out)
            c_val[r, j] = np.float32(d + c_val[r, j])


@arithmetic
def tile_chain_over_tiles(a_val, a_exp, b_val, b_exp, rows, K, first, stride, count, tile, padded, params, work,
                          result):
    """:func:`~.chain.chain_over_tiles` for the tile: ``result[r, j]`` = fp32 value of one chain from +0.

    As in the reference, padded tiles are walked at full width: blocks past K hold no product but still run
    their block step on the accumulator (for these GEMM accumulators the identity unless frac < frac_out).
    """
    nfma, frac_out, late_c = params.nfma, params.frac_out, params.late_c
    c_sig, c_lead, e_max, scale, total = work
    lanes = total.shape[1]
    for r in range(rows):
        for j in range(lanes):
            c_sig[r, j] = 0
            c_lead[r, j] = NO_LEAD
            result[r, j] = np.float32(0.0)
    for i in range(chain_range_count(stride, count)):
        k0, k1 = chain_range(K, first, stride, count, tile, padded, i)
        for kb in range(k0, k1, nfma):
            ke = min(kb + nfma, k1, K)
            if late_c:
                tile_block_late(a_val, a_exp, b_val, b_exp, rows, kb, ke, params, result, c_sig, c_lead, e_max,
                                scale, total)
            else:
                tile_block_early(a_val, a_exp, b_val, b_exp, rows, kb, ke, params, c_sig, c_lead, e_max,
                                 scale, total)
    if not late_c:
        for r in range(rows):
            for j in range(lanes):
                exp = max(c_lead[r, j], RESULT_EXP_FLOOR) - frac_out
                result[r, j] = np.float32(c_sig[r, j]) * pow2_float32(exp)


@arithmetic
def tile_split_partial(a_val, a_exp, b_val, b_exp, rows, K, s, schedule, params, work, result, partial):
    """:func:`~.schedule.split_partial` for the tile: ``partial`` = fp32 sum of split s's chains (+0 if none)."""
    lanes = partial.shape[1]
    clear_tile(partial)
    for c in range(split_chains(K, s, schedule)):
        first, stride, n = chain_tiles_of(K, s, c, schedule)
        tile_chain_over_tiles(a_val, a_exp, b_val, b_exp, rows, K, first, stride, n, schedule.tile, schedule.padded,
                              params, work, result)
        for r in range(rows):
            for j in range(lanes):
                partial[r, j] = np.float32(partial[r, j] + result[r, j])


@arithmetic
def tile_accumulate(a_val, a_exp, b_val, b_exp, rows, K, schedule, params, work, sums, acc):
    """:func:`~.schedule.accumulate_one` for the tile: ``acc[r, j]`` = fp32 accumulator of output (r, j).

    ``work`` = (c_sig, c_lead, e_max, scale, total), ``sums`` = (result, partial, slot): arrays [rows, lanes] of
    dtypes (lane int, int32, int16, float32, lane int) and float32.
    """
    splits, pairwise = schedule.splits, schedule.pairwise
    result, partial, slot = sums
    clear_tile(acc)
    clear_tile(slot)
    for i in range(splits):
        s, target, flush = combine_step(splits, pairwise, i)
        tile_split_partial(a_val, a_exp, b_val, b_exp, rows, K, s, schedule, params, work, result, partial)
        combine_tile(acc, slot, partial, target, flush)

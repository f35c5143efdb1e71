"""The CPU's offset engine: :mod:`mmaemu.arith.offset`'s block step on 512-bit vectors (:mod:`.simd`; two 256-bit
registers each on AVX2, whose FMA rounds toward zero by MXCSR inside the chains' toward-zero regions).

The arithmetic is that of the ``cuda:offset`` kernel, with the constants of :func:`mmaemu.arith.offset.offset_params`
and the operand tables of :func:`mmaemu.arith.offset.offset_tables` (add-max exponents); the proofs of
:mod:`mmaemu.arith.offset` (conditions 1-9) hold unchanged, lane by lane. What differs is only how the lanes are
laid out:

* a *tile* is :data:`ROWS` rows of A times one *panel* of :data:`PANEL` columns of B (:data:`VECTORS` vectors of 16
  lanes), its state in registers: per output the offset sum S, the threshold word and the count;
* the count of condition 7 is kept as four byte counters per output (the flags' bit 7 shifted to bit 0 of its own
  byte, one add per 4-k group) and summed at the block end: ``n`` itself, where the GPU's ``dp4a`` sums ``128 * n``.
  Each byte counts at most nfma / 4 products, and their sum n <= nfma < 256 leaves the byte sum by one multiply
  (``n * 0x01010101 >> 24``) exact; :func:`offset_engine_decline` checks nfma;
* the exponent words (two k per word, :func:`~mmaemu.arith.offset.exponent_word`) are summed by a 32-bit add, which
  is :func:`~mmaemu.arith.packed.add_u16x2` here because no half-sum carries (condition 6), and maximised by
  ``vpmaxuw``, :func:`~mmaemu.arith.packed.max_u16x2` per lane;
* a block past K (zero padding of a split tile) runs :func:`mmaemu.arith.offset.offset_empty_block` itself, and each
  chain ends with :func:`~mmaemu.arith.offset.offset_chain_value`; the schedule is walked with the functions of
  ``accumulate_one`` (``combine_step``, ``split_chains``, ``chain_tiles_of``, ``chain_range``).

Operand layout (k-major, K padded with zero codes to ``Kp``, a multiple of K_PASS = 16): B's panel p is
``b_val[p][k, j]`` (fp32), ``b_exp[p][k // 2, j]`` (exponent word of k and k + 1), ``b_low[p][k // 4, j]`` and
``b_sign[p][k // 4, j]`` (low-byte and sign-byte words of four k); A's rows of a task the same with the row as the
column. Both are packed by :func:`~mmaemu.arith.offset.offset_pack`.
"""

import numpy as np

from .._jit import arithmetic
from ..arith.chain import chain_range, chain_range_count
from ..arith.fp32 import FP32_FRACTION_BITS
from ..arith.offset import EXPONENT_FIELD, K_PASS, block_range, offset_chain_value, offset_empty_block, offset_pack
from ..arith.packed import BYTE_ONES
from ..arith.schedule import chain_tiles_of, combine, combine_step, split_chains
from .simd import (add_f32, add_i32, and_i32, andnot_i32, bits_of_f32, broadcast_f32, broadcast_i32,
                   enter_toward_zero, f32_of_bits, fma_toward_zero_f32, leave_toward_zero, load_f32, load_u32,
                   lshr_i32, max_f32, max_i32, max_u16x2_i32, min_i32, mul_i32, or_i32, rotate16_i32, shl_i32,
                   store_f32, sub_f32, sub_i32, xor_i32)

ROWS = 2  # rows of A per tile: each B vector loaded once serves both
VECTORS = 4  # 16-lane vectors per row of a tile
PANEL = 16 * VECTORS  # columns of B per panel
SIGN_BIT = -0x80000000
MAGNITUDE = 0x7FFFFFFF
# The bit masks of the block step (int32 values, passed at run time like the offset constants, so that a test can
# alter each without recompiling): the byte sum's multiplier, fp32's sign bit, its magnitude, its sign and
# exponent field.
MASKS = (BYTE_ONES, SIGN_BIT, MAGNITUDE, EXPONENT_FIELD - 2**32)


def padded_k(K: int) -> int:
    """K rounded up to whole passes (K_PASS), at least one."""
    return max(K_PASS, -(-K // K_PASS) * K_PASS)


@arithmetic
def pack_columns(codes, row0, c0, c1, tables, val, exp, low, sign):
    """Rows ``row0 + c`` of ``codes`` (zero codes past its rows or past K) into columns c in [c0, c1) of the k-major
    arrays, in the words of :func:`~mmaemu.arith.offset.offset_pack` (add-max), 4 k at a time for every column so
    that the stores of one group are adjacent. Groups inside the codes are read directly (the same table entries
    offset_pack reads); the ragged edge goes through offset_pack itself, which supplies the zero codes
    (``tests/test_offset_engine.py`` compares the whole layout with offset_pack's)."""
    values, exps, lows, signs = tables
    N, K = codes.shape
    whole = K // 4  # groups with all four k inside K
    for g in range(low.shape[0]):
        k = 4 * g
        for c in range(c0, c1):
            row = row0 + c
            if row < N and g < whole:
                x0, x1, x2, x3 = codes[row, k], codes[row, k + 1], codes[row, k + 2], codes[row, k + 3]
                v0, v1, v2, v3 = values[x0], values[x1], values[x2], values[x3]
                e01 = np.uint32(exps[x0] | (exps[x1] << np.uint32(16)))
                e23 = np.uint32(exps[x2] | (exps[x3] << np.uint32(16)))
                lw = np.uint32(lows[x0] | (lows[x1] << np.uint32(8)) | (lows[x2] << np.uint32(16))
                               | (lows[x3] << np.uint32(24)))
                sg = np.uint32(signs[x0] | (signs[x1] << np.uint32(8)) | (signs[x2] << np.uint32(16))
                               | (signs[x3] << np.uint32(24)))
            else:
                v0, v1, v2, v3, e01, e23, lw, sg = offset_pack(codes, row, g, tables, 0, False)
            val[k, c] = v0
            val[k + 1, c] = v1
            val[k + 2, c] = v2
            val[k + 3, c] = v3
            exp[2 * g, c] = e01
            exp[2 * g + 1, c] = e23
            low[g, c] = lw
            sign[g, c] = sg


@arithmetic
def pack_panels(lo, hi, codes, tables, val, exp, low, sign):
    """Panels lo .. hi-1 of B (rows ``p * PANEL ...`` of ``codes``) into ``val[p]``, ``exp[p]``, ``low[p]``,
    ``sign[p]``."""
    for p in range(lo, hi):
        pack_columns(codes, p * PANEL, 0, PANEL, tables, val[p], exp[p], low[p], sign[p])


@arithmetic
def pack_row_blocks(lo, hi, codes, tables, val, exp, low, sign):
    """Blocks lo .. hi-1 of PANEL rows of A into the same columns of the k-major arrays (columns past A's rows:
    zero codes)."""
    for block in range(lo, hi):
        pack_columns(codes, 0, block * PANEL, min((block + 1) * PANEL, val.shape[1]), tables, val, exp, low, sign)


# ----------------------------------------------------------------------------------------------------------------
# One row of a tile: VECTORS vectors of outputs (tuples of vectors stay in registers)


@arithmetic
def row_exponent_sums(a_exp, w, r, b_exp):
    """Exponent word w of row r of A plus that of every column (two exponent sums per lane)."""
    a = broadcast_i32(a_exp[w, r])
    return (add_i32(a, load_u32(b_exp, w, 0)), add_i32(a, load_u32(b_exp, w, 16)),
            add_i32(a, load_u32(b_exp, w, 32)), add_i32(a, load_u32(b_exp, w, 48)))


@arithmetic
def row_exponent_max(e, x):
    """The per-half maxima of two tuples of exponent words."""
    return (max_u16x2_i32(e[0], x[0]), max_u16x2_i32(e[1], x[1]), max_u16x2_i32(e[2], x[2]),
            max_u16x2_i32(e[3], x[3]))


@arithmetic
def vector_start(e, c, vectors):
    """:func:`mmaemu.arith.offset.offset_start` on one vector, E_prod from its exponent maxima (as
    :func:`~mmaemu.arith.offset.offset_block_start`): the offset sum and the threshold word."""
    p_shift, floor, m_add, tau_add, tau_max, top4, ones, sign_bit, magnitude, one, zero, exp_field, mantissa = \
        vectors
    largest = max_u16x2_i32(e, rotate16_i32(e, 16))
    product_bits = add_i32(shl_i32(largest, FP32_FRACTION_BITS), p_shift)
    c_bits = bits_of_f32(c)
    top = bits_of_f32(max_f32(max_f32(f32_of_bits(product_bits), f32_of_bits(floor)),
                              f32_of_bits(and_i32(c_bits, magnitude))))
    e_field = lshr_i32(top, FP32_FRACTION_BITS)  # top is a positive pattern
    m_bits = add_i32(shl_i32(e_field, FP32_FRACTION_BITS), m_add)
    signed_m = f32_of_bits(or_i32(m_bits, and_i32(c_bits, sign_bit)))
    acc = add_f32(f32_of_bits(m_bits), sub_f32(fma_toward_zero_f32(c, one, signed_m), signed_m))
    shift = min_i32(max_i32(add_i32(e_field, tau_add), zero), tau_max)
    return acc, sub_i32(top4, mul_i32(shift, ones))


@arithmetic
def row_start(e, c_val, r, vectors):
    """:func:`vector_start` for the VECTORS vectors of row r (c from ``c_val[r]``), counts at 0."""
    s0, t0 = vector_start(e[0], load_f32(c_val, r, 0), vectors)
    s1, t1 = vector_start(e[1], load_f32(c_val, r, 16), vectors)
    s2, t2 = vector_start(e[2], load_f32(c_val, r, 32), vectors)
    s3, t3 = vector_start(e[3], load_f32(c_val, r, 48), vectors)
    zero = vectors[10]
    return (s0, s1, s2, s3), (t0, t1, t2, t3), (zero, zero, zero, zero)


@arithmetic
def vector_group(a, low_a, sign_a, b_val, b_low, b_sign, k, g, column, s, t, n):
    """Four k of one vector (:func:`~mmaemu.arith.offset.offset_group`): four fused multiply-adds rounding toward
    zero and the byte counters of the products floored one unit too far."""
    s = fma_toward_zero_f32(a[0], load_f32(b_val, k, column), s)
    s = fma_toward_zero_f32(a[1], load_f32(b_val, k + 1, column), s)
    s = fma_toward_zero_f32(a[2], load_f32(b_val, k + 2, column), s)
    s = fma_toward_zero_f32(a[3], load_f32(b_val, k + 3, column), s)
    exact = add_i32(add_i32(low_a, load_u32(b_low, g, column)), t)
    flags = andnot_i32(exact, xor_i32(sign_a, load_u32(b_sign, g, column)))
    return s, add_i32(n, lshr_i32(flags, 7))


@arithmetic
def row_group(a_val, a_low, a_sign, r, b_val, b_low, b_sign, g, s, t, n):
    """Four k (group g) of row r against every vector of the panel."""
    k = 4 * g
    a = (broadcast_f32(a_val[k, r]), broadcast_f32(a_val[k + 1, r]), broadcast_f32(a_val[k + 2, r]),
         broadcast_f32(a_val[k + 3, r]))
    low_a, sign_a = broadcast_i32(a_low[g, r]), broadcast_i32(a_sign[g, r])
    s0, n0 = vector_group(a, low_a, sign_a, b_val, b_low, b_sign, k, g, 0, s[0], t[0], n[0])
    s1, n1 = vector_group(a, low_a, sign_a, b_val, b_low, b_sign, k, g, 16, s[1], t[1], n[1])
    s2, n2 = vector_group(a, low_a, sign_a, b_val, b_low, b_sign, k, g, 32, s[2], t[2], n[2])
    s3, n3 = vector_group(a, low_a, sign_a, b_val, b_low, b_sign, k, g, 48, s[3], t[3], n[3])
    return (s0, s1, s2, s3), (n0, n1, n2, n3)


@arithmetic
def vector_end(s, n, vectors):
    """:func:`~mmaemu.arith.offset.offset_block_end` on one vector: the count n (the byte counters' sum) added to
    S's pattern, M rebuilt from S's exponent, ``S - M``."""
    ones, exp_field, mantissa = vectors[6], vectors[11], vectors[12]
    count = lshr_i32(mul_i32(n, ones), 24)
    bits = add_i32(bits_of_f32(s), count)
    m = f32_of_bits(or_i32(and_i32(bits, exp_field), mantissa))
    return sub_f32(f32_of_bits(bits), m)


@arithmetic
def row_end(s, n, c_val, r, vectors):
    """:func:`vector_end` for the vectors of row r, into ``c_val[r]``."""
    store_f32(c_val, r, 0, vector_end(s[0], n[0], vectors))
    store_f32(c_val, r, 16, vector_end(s[1], n[1], vectors))
    store_f32(c_val, r, 32, vector_end(s[2], n[2], vectors))
    store_f32(c_val, r, 48, vector_end(s[3], n[3], vectors))


@arithmetic
def vector_constants(constants, masks):
    """The vectors the block step reads: :class:`~mmaemu.arith.offset.OffsetConstants` and the bit masks, in the
    order :func:`vector_start` unpacks them (``masks``: :data:`MASKS`)."""
    i32 = np.int32
    return (broadcast_i32(i32(constants.p_add)), broadcast_i32(i32(constants.floor_bits)),
            broadcast_i32(i32(constants.m_add)), broadcast_i32(i32(constants.tau_add)),
            broadcast_i32(i32(constants.tau_max)), broadcast_i32(i32(constants.top4)), broadcast_i32(i32(masks[0])),
            broadcast_i32(i32(masks[1])), broadcast_i32(i32(masks[2])), broadcast_f32(np.float32(1.0)),
            broadcast_i32(i32(0)), broadcast_i32(i32(masks[3])), broadcast_i32(i32(constants.mantissa)))


@arithmetic
def tile_block(a, r0, b, kb, ke, vectors, c_val):
    """One early-accumulator block step (b.1, truncation deferred) over k in [kb, ke) for rows r0, r0 + 1 of the
    task's A and the panel ``b``; updates ``c_val`` [ROWS, PANEL]. kb is a multiple of K_PASS and the packed operands
    hold zero codes from ke up to the next multiple of K_PASS (:func:`~mmaemu.arith.offset.block_range`)."""
    a_val, a_exp, a_low, a_sign = a
    b_val, b_exp, b_low, b_sign = b
    first, end = block_range(kb, ke)
    w0, w1 = first >> np.uint32(1), end >> np.uint32(1)
    e0 = row_exponent_sums(a_exp, w0, r0, b_exp)
    e1 = row_exponent_sums(a_exp, w0, r0 + 1, b_exp)
    for w in range(w0 + 1, w1):
        e0 = row_exponent_max(e0, row_exponent_sums(a_exp, w, r0, b_exp))
        e1 = row_exponent_max(e1, row_exponent_sums(a_exp, w, r0 + 1, b_exp))
    s0, t0, n0 = row_start(e0, c_val, 0, vectors)
    s1, t1, n1 = row_start(e1, c_val, 1, vectors)
    for g in range(first >> np.uint32(2), end >> np.uint32(2)):
        s0, n0 = row_group(a_val, a_low, a_sign, r0, b_val, b_low, b_sign, g, s0, t0, n0)
        s1, n1 = row_group(a_val, a_low, a_sign, r0 + 1, b_val, b_low, b_sign, g, s1, t1, n1)
    row_end(s0, n0, c_val, 0, vectors)
    row_end(s1, n1, c_val, 1, vectors)


@arithmetic
def tile_chain(a, r0, b, K, first, stride, count, schedule, constants, vectors, c_val, work):
    """One chain from +0 over ``count`` k-tiles (``chain_range``); ``c_val`` ends with its deferred accumulator.
    Blocks start every nfma k from each range's start; those past K run on the accumulator alone. The block steps
    run in a toward-zero region (:func:`mmaemu.cpu.simd.enter_toward_zero`: MXCSR on AVX2, nothing on AVX-512),
    which the empty blocks (their float64 emulation of the FMA needs rounding to nearest) and the chain's caller
    (the split combination) stay out of."""
    nfma = constants.nfma
    for r in range(ROWS):
        for j in range(PANEL):
            c_val[r, j] = np.float32(0.0)
    saved = enter_toward_zero()
    for i in range(chain_range_count(stride, count)):
        k0, k1 = chain_range(K, first, stride, count, schedule.tile, schedule.padded, i)
        for kb in range(k0, k1, nfma):
            if kb < K:
                tile_block(a, r0, b, np.uint32(kb), np.uint32(min(kb + nfma, k1, K)), vectors, c_val)
            else:
                leave_toward_zero(saved)
                offset_empty_block(constants, c_val, work)
                saved = enter_toward_zero()
    leave_toward_zero(saved)


@arithmetic
def tile_accumulate(a, r0, b, K, schedule, constants, vectors, work, sums):
    """:func:`mmaemu.arith.schedule.accumulate_one` for the tile: ``acc[r, j]`` (of ``sums`` = (c_val, partial,
    acc, slot), float32 [ROWS, PANEL]) = the fp32 accumulator of output (r0 + r, j)."""
    c_val, partial, acc, slot = sums
    splits, pairwise, frac_out = schedule.splits, schedule.pairwise, constants.frac_out
    for r in range(ROWS):
        for j in range(PANEL):
            acc[r, j] = np.float32(0.0)
            slot[r, j] = np.float32(0.0)
    for i in range(splits):
        s, target, flush = combine_step(splits, pairwise, i)
        for r in range(ROWS):
            for j in range(PANEL):
                partial[r, j] = np.float32(0.0)
        for c in range(split_chains(K, s, schedule)):
            first, stride, n = chain_tiles_of(K, s, c, schedule)
            tile_chain(a, r0, b, K, first, stride, n, schedule, constants, vectors, c_val, work)
            for r in range(ROWS):
                for j in range(PANEL):
                    partial[r, j] = np.float32(partial[r, j] + offset_chain_value(c_val[r, j], frac_out))
        for r in range(ROWS):
            for j in range(PANEL):
                acc[r, j], slot[r, j] = combine(acc[r, j], slot[r, j], partial[r, j], target, flush)


@arithmetic
def offset_panel_rows(m_lo, m_hi, a, b, n0, K, schedule, constants, masks, out):
    """out[m, n0:n0+PANEL] = fp32 accumulators of rows m_lo .. m_hi-1 of A and one packed panel of B (finite
    codes), bit-identical to ``accumulate_codes(..., reference=True)``. ``a``: A packed (:func:`pack_row_blocks`,
    a column per row, an even number of columns), ``b``: the panel's four arrays, both (val, exp, low, sign);
    m_lo even. ``constants``: the :class:`~mmaemu.arith.offset.OffsetConstants` of the call (add-max);
    ``schedule`` as ``accumulate_one`` takes it (:class:`~mmaemu.arith.params.Schedule`); ``masks``: :data:`MASKS`."""
    vectors = vector_constants(constants, masks)
    shape = (ROWS, PANEL)
    work = (np.empty(shape, np.uint32), np.empty(shape, np.float32), np.empty(shape, np.uint32),
            np.empty(shape, np.uint32))
    sums = (np.empty(shape, np.float32), np.empty(shape, np.float32), np.empty(shape, np.float32),
            np.empty(shape, np.float32))
    acc = sums[2]
    N = out.shape[1]
    for r0 in range(m_lo, m_hi, ROWS):
        tile_accumulate(a, r0, b, K, schedule, constants, vectors, work, sums)
        for r in range(min(ROWS, m_hi - r0)):
            for j in range(min(PANEL, N - n0)):
                out[r0 + r, n0 + j] = acc[r, j]

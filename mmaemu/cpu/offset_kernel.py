"""The CPU's offset engine: :mod:`mmaemu.arith.offset`'s block step on 512-bit vectors (:mod:`.simd`; two 256-bit
registers each on AVX2, whose FMA rounds toward zero by MXCSR inside the chains' toward-zero regions).

The arithmetic is that of the ``cuda:offset`` kernel, with the constants of :func:`mmaemu.arith.offset.offset_params`
and the operand tables of :func:`mmaemu.arith.offset.offset_tables`; the proofs of :mod:`mmaemu.arith.offset`
(conditions 1-8) hold unchanged, lane by lane. What differs is how the lanes are laid out and two steps that
vectors do more cheaply:

* a *tile* is :data:`ROWS` = 4 rows of A times one *panel* of :data:`PANEL` = 64 columns of B. Its block step runs
  the exponent pass over the whole panel, then the products over two *sub-tiles* of 4 rows x :data:`VECTORS` = 2
  vectors of 16 lanes, whose state (per output the offset sum S, the threshold word T and the count) is 24 of the
  32 zmm registers; the other 8 hold the sub-tile's B words and the operands of the moment, so nothing spills in
  the product loop. Each B vector loaded serves 4 rows, each broadcast A value 2 vectors;
* the *byte exponent pass* (:func:`mmaemu.arith.offset.exponent_bytes`, its proof there): exponents as signed
  bytes, one saturating add and one signed maximum per k for 64 outputs (the add-max pass of the GPU needs one
  add and one 16-bit maximum per two k for 16 outputs); A's exponent byte is stored four times in a word, so that
  it is broadcast by a plain load;
* the count of condition 7 is kept as four byte counters per output (the flags' bit 7 shifted to bit 0 of its own
  byte, one add per 4-k group) and summed at the block end: ``n`` itself, where the GPU's ``dp4a`` sums ``128 * n``.
  Each byte counts at most nfma / 4 products, and their sum n <= nfma < 256 leaves the byte sum by one multiply
  (``n * 0x01010101 >> 24``) exact; :func:`mmaemu.cpu.features.offset_call_decline` checks nfma;
* a block past K (zero padding of a split tile) runs :func:`mmaemu.arith.offset.offset_empty_block` itself, and each
  chain enters its split's partial by :func:`~mmaemu.arith.offset.add_chain_values` (``offset_chain_value`` per
  output, as in ``cuda:offset``); the schedule is walked with the functions of ``accumulate_one``
  (``combine_step``, ``split_chains``, ``chain_tiles_of``, ``chain_range``) and the partials combined by
  :func:`mmaemu.arith.schedule.combine_tile`, the split-K skeleton of every engine.

What is written once, and what per target. The step's per-output arithmetic (the start, the flags of the products to
correct and the block end) has one source, :mod:`mmaemu.arith.offset_step`, on the lane operations of
:mod:`mmaemu.arith.lanes` (scalar overloads there, vector ones in :mod:`.simd`): :mod:`mmaemu.arith.offset` compiles
it on scalars for ``cuda:offset`` (the same SASS instructions per product as before on sm_90, sm_89 and sm_120), and
this module on vectors (``vector_start``, ``vector_end`` and ``row_count`` below; measured no slower than the
hand-written vector forms they replaced: the product loop the same 126 instructions per 4-k group of a sub-tile
on AVX-512, 5 fewer on AVX2; docs/performance.md, "One offset block-step source"). The start takes ``abs_f32`` of
c, so that the GPU's maximum takes |c| as an operand modifier. Not shared,
by design: the tile and its state (a GPU thread's arrays in registers; here tuples of vectors, 24 of the 32 zmm
registers), the exponent pass (bytes here: one saturating add and one maximum per k for 64 outputs; on the GPU one
``VIADDMNMX.U16x2`` or bf16x2 power-sum fma per two k per output, where the byte pass on a thread's scalars would be
two instructions per k, four times as many) and the count's unit (byte counters summed once per block here,
``IDP4A`` there). Shared besides: the constants, the tables, the empty block, the chain's end, the split-K skeleton
and the proofs.

Operand layout (K padded with zero codes to ``Kp``, a multiple of K_PASS = 16). B's panel (:class:`Operand`):
``val[k, j]`` fp32, ``exp[k, j]`` exponent byte (int8), ``low[k // 4, j]`` and ``sign[k // 4, j]`` the low-byte
and sign-byte words of four k (:func:`~mmaemu.arith.offset.offset_pack`'s words), j < 64. A is *tile-major*
(:func:`pack_tiles`; rows padded to a multiple of ROWS): uint32 words ``a[t * Kp / 4 + g, w]``, one row of
:data:`TILE_WORDS` = 40 words per tile t (rows 4t ... 4t + 3) and 4-k group g: words ``TILE_VALUES + 4 * i + r``
the fp32 pattern of row r's value at k = 4g + i, ``TILE_LOWS + r`` and ``TILE_SIGNS + r`` row r's low-byte and
sign-byte words, ``TILE_EXPONENTS + 4 * i + r`` its exponent byte times 0x01010101 (so that it is broadcast by a
plain load). Why: the group loop then reads all of A from one pointer at constant offsets. With A's fields in
three row-major arrays, the four rows needed twelve row pointers, more than the general registers left: the loop
(127 instructions per group for 32 FMAs) reloaded 8 of them from the stack and spilled two threshold vectors; now
118 instructions, nothing spilled (``inspect_asm``, docs/performance.md).

How the steps are compiled matters as much (docs/performance.md, "The offset engine against the prototype"): the
loop over the blocks is in :func:`tile_chain` itself, not in a function called per block (a call of a Numba
function with arrays increments and decrements their reference counts, 12 atomics per block on lines that every
thread shares), and :func:`subtile_block` is compiled into it (:func:`mmaemu.base._jit.arithmetic_inlined`: its
call passed the operands and 21 vectors through memory twice per block).
"""

from typing import NamedTuple

import numpy as np

from ..base._jit import arithmetic, arithmetic_inlined
from ..arith.chain import chain_range, chain_range_count
from ..arith.fp32 import FP32_EXPONENT_BIAS, FP32_FRACTION_BITS
from ..arith.fp32 import float32_bits as bits_of_f32_scalar
from ..arith.offset import EXPONENT_FIELD, K_PASS, add_chain_values, block_range, offset_empty_block
from ..arith.offset_step import StepConstants, correction_flags, step_end, step_start
from ..arith.packed import BYTE_ONES
from ..arith.schedule import chain_tiles_of, clear_tile, combine_step, combine_tile, split_chains
from .simd import (add_i8, add_i32, add_saturated_i8, and_i8, and_i32, ashr_i32, broadcast_f32, broadcast_i32,
                   broadcast_load_i32, bytes_of_i32, enter_toward_zero, f32_of_bits, f32_of_i32, fma_toward_zero_f32,
                   i32_of_bytes, leave_toward_zero, less_u8, load_f32, load_word, load_i8, load_u32, lshr_by_i32, lshr_i32,
                   max_i8, max_u8, mul_f32, mul_i32, or_i8, select_i8, shl_i32, store_f32, store_low_bytes,
                   store_u32, sub_i8, trailing_zeros_i8, widen_i8, xor_i8)

ROWS = 4  # rows of A per tile: each B vector loaded serves all of them
VECTORS = 2  # 16-lane vectors per row of a sub-tile
PANEL = 64  # columns of B per panel: one vector of exponent bytes
SUBTILE = 16 * VECTORS  # columns of a sub-tile
BYTES_LOWEST = -0x7F7F7F80  # 0x80808080: -128 in every byte, the exponent pass's start
# A's tile-major words of one tile and 4-k group (module docstring): where each field starts.
TILE_VALUES = 0  # 16 fp32 patterns, k-major: word 4 * i + r holds row r's value at k = 4 * g + i
TILE_LOWS = 16  # 4 low-byte words, one per row
TILE_SIGNS = 20  # 4 sign-byte words, one per row
TILE_EXPONENTS = 24  # 16 exponent words (the byte four times), k-major like the values
TILE_WORDS = 40
WORD_BLOCK = 16  # 4-k groups of B's panel transposed, then decoded, at a time: 64 k, one cache line of each row


class Operand(NamedTuple):
    """B's packed panel (module docstring): fp32 values, exponent bytes (int8), low-byte and sign-byte words
    (uint32). A is packed tile-major instead (:func:`pack_tiles`)."""

    val: np.ndarray
    exp: np.ndarray
    low: np.ndarray
    sign: np.ndarray


class BitMasks(NamedTuple):
    """The bit masks of the block step (int32 values, passed at run time like the offset constants, so that a test
    can alter each without recompiling)."""

    byte_sum: int  # the byte counters' multiplier (0x01010101)
    sign_bit: int  # fp32's sign bit
    exponent_field: int  # fp32's sign and exponent field
    exponent_bias: int  # the byte pass's pattern bias: (s + 127) * 2**23 is the pattern of 2**s


MASKS = BitMasks(BYTE_ONES, -0x80000000, EXPONENT_FIELD - 2**32, FP32_EXPONENT_BIAS << FP32_FRACTION_BITS)


@arithmetic
def padded_k(K):
    """K rounded up to whole passes (K_PASS), at least one."""
    return max(K_PASS, (K + K_PASS - 1) // K_PASS * K_PASS)


# ----------------------------------------------------------------------------------------------------------------
# Packing: A by the tables (values float32, exponent bytes int8, low bytes uint32, sign bytes uint32, per code), B
# by decode_words, which gives the same entries (checked for every code: mmaemu.cpu.offset_engine.code_decode)


class CodeDecode(NamedTuple):
    """The fields of a format's codes that :func:`decode_words` reads (int32 values; :func:`mmaemu.cpu.
    offset_engine.code_decode` derives them and checks the decode against the tables for every code)."""

    mant_bits: int  # significand bits below the implicit one
    min_exponent: int  # the exponent of the subnormals (1 - bias), that of exponent field 1 too
    special: int  # the smallest magnitude code (c & 0x7F) that is NaN or Inf: it and those above are absent
    low_base: int  # low byte = ex + trailing zero bits of the significand + low_base (- mant_bits - la_min)
    zero_low: int  # low byte of an absent term (ZERO_LOW)
    exponent_absent: int  # exponent byte of an absent term (EXPONENT_BYTE_ABSENT)
    sign_byte: int  # sign byte of a negative term (SIGN_BYTE)


class DecodeVectors(NamedTuple):
    """:class:`CodeDecode` as the byte vectors :func:`decode_words` reads (each field's byte in all 64 bytes; the
    shift count in every int32 lane)."""

    magnitude: object  # 0x7F: the code without its sign bit
    mant_bits: object  # int32 lanes: the shift from the magnitude to the exponent field
    field_mask: object  # 0x7F >> mant_bits: the exponent field after that shift
    mant_mask: object  # 2**mant_bits - 1: the significand's bits below the implicit one
    implicit: object  # 2**mant_bits: the implicit one of a normal code
    one: object  # 1
    exponent_step: object  # min_exponent - 1: ex = max(field, 1) + min_exponent - 1
    special_less: object  # special - 1: a code is present where 0 < magnitude < special
    power_bias: object  # 127 - mant_bits: the fp32 exponent field of 2**(ex - mant_bits) is ex + power_bias
    low_base: object
    zero_low: object
    exponent_absent: object
    sign_byte: object
    power_field: object  # int32 lanes: fp32's exponent field (0x7F800000)


@arithmetic
def byte_vector(x):
    """The low byte of the integer x in all 64 bytes."""
    return bytes_of_i32(broadcast_i32(np.uint32(np.uint32(x & 0xFF) * np.uint32(BYTE_ONES))))


@arithmetic
def decode_vectors(d):
    """The :class:`DecodeVectors` of a format's :class:`CodeDecode` ``d``."""
    mbits = d.mant_bits
    return DecodeVectors(byte_vector(0x7F), broadcast_i32(np.int32(mbits)), byte_vector(0x7F >> mbits),
                         byte_vector((1 << mbits) - 1), byte_vector(1 << mbits), byte_vector(1),
                         byte_vector(d.min_exponent - 1), byte_vector(d.special - 1), byte_vector(127 - mbits),
                         byte_vector(d.low_base), byte_vector(d.zero_low), byte_vector(d.exponent_absent),
                         byte_vector(d.sign_byte), broadcast_i32(np.int32(0xFF << FP32_FRACTION_BITS)))


@arithmetic
def store_code_values(panel, k, column, sig, power, exponents):
    """Row k of the panel's values and exponent bytes, columns ``column ... column + 15``: the signed significand
    (int32 lanes) times the power of two whose fp32 pattern is ``power`` (exact: at most 4 significant bits times
    a normal power of two, a normal product), and the low byte of each lane of ``exponents``."""
    store_f32(panel.val, k, column, mul_f32(f32_of_i32(sig), f32_of_bits(power)))
    store_low_bytes(panel.exp, k, column, exponents)


@arithmetic
def decode_words(words, g, column, v, panel):
    """Group g of the panel (k = 4g ... 4g + 3), columns ``column ... column + 15``, from ``words[g, column:
    column + 16]`` (uint32: byte i of a lane is the code at k = 4g + i): the tables' entries
    (:func:`mmaemu.cpu.offset_engine.packing_tables`; checked for every code at every byte position by
    :func:`mmaemu.cpu.offset_engine.code_decode`) by arithmetic on vectors, no branch and no table read. The
    exponent, low and sign bytes are computed on all 64 codes at once, in bytes (the low-byte and sign-byte words
    are then the lanes themselves); the values per k on 16 int32 lanes, as the signed significand (0 for an absent
    code) times 2**(ex - mant_bits). Fields (``v``: :class:`DecodeVectors`): ex = max(field, 1) + min_exponent - 1;
    the significand the mantissa with the implicit one where field > 0; the low byte ex + its trailing zero bits
    + low_base; an absent code (magnitude 0 or at least ``special``) has value +0, the absent exponent byte, the
    zero low byte and sign byte 0."""
    w = load_u32(words, g, column)
    c = bytes_of_i32(w)
    mag = and_i8(c, v.magnitude)
    field = and_i8(bytes_of_i32(lshr_by_i32(i32_of_bytes(mag), v.mant_bits)), v.field_mask)
    normal = less_u8(v.mant_mask, mag)
    sig = or_i8(and_i8(mag, v.mant_mask), and_i8(normal, v.implicit))
    ex = add_i8(max_u8(field, v.one), v.exponent_step)
    present = less_u8(sub_i8(mag, v.one), v.special_less)
    negative = less_u8(v.magnitude, c)
    low = add_i8(add_i8(ex, trailing_zeros_i8(sig)), v.low_base)
    store_u32(panel.low, g, column, i32_of_bytes(select_i8(present, low, v.zero_low)))
    store_u32(panel.sign, g, column, i32_of_bytes(and_i8(and_i8(present, negative), v.sign_byte)))
    present_sig = and_i8(sig, present)
    signed = i32_of_bytes(sub_i8(xor_i8(present_sig, negative), negative))
    power = i32_of_bytes(add_i8(ex, v.power_bias))
    exponents = i32_of_bytes(select_i8(present, ex, v.exponent_absent))
    k = 4 * g
    # byte i of each lane: the significand sign-extended, the power's byte moved to fp32's exponent field
    store_code_values(panel, k, column, ashr_i32(shl_i32(signed, 24), 24), and_i32(shl_i32(power, 23),
                      v.power_field), exponents)
    store_code_values(panel, k + 1, column, ashr_i32(shl_i32(signed, 16), 24), and_i32(shl_i32(power, 15),
                      v.power_field), lshr_i32(exponents, 8))
    store_code_values(panel, k + 2, column, ashr_i32(shl_i32(signed, 8), 24), and_i32(shl_i32(power, 7),
                      v.power_field), lshr_i32(exponents, 16))
    store_code_values(panel, k + 3, column, ashr_i32(signed, 24), and_i32(lshr_i32(power, 1), v.power_field),
                      lshr_i32(exponents, 24))


@arithmetic
def code_words(codes, row0, words, g0, g1):
    """``words[g, j]`` (uint32 [Kp / 4, PANEL]; groups g0 ... g1 - 1) = the codes of row row0 + j of ``codes`` [N, K] at k = 4g ... 4g + 3,
    little-endian (zero codes past N and K): the panel's 4-k groups transposed to k-major, one word per column.
    Group by group, so that the 64 rows' lines of codes stay in the cache for 16 groups, and the words are
    written in order (column by column, the words of one column are 256 bytes apart: 480 groups of them overflow
    the first-level cache, and the writes were three times slower)."""
    N, K = codes.shape
    full = K // 4
    rows = max(0, min(PANEL, N - row0))
    at = np.uint64  # unsigned indices: no negative-index wrap in the loops
    u = np.uint32
    for g in range(g0, g1):
        if g < full:
            for j in range(rows):
                words[at(g), at(j)] = load_word(codes, row0 + j, 4 * g)
        elif g == full:
            for j in range(rows):
                last = u(0)
                for k in range(4 * full, K):
                    last |= u(u(codes[at(row0 + j), at(k)]) << u(8 * (k - 4 * full)))
                words[at(g), at(j)] = last
        else:
            for j in range(rows):
                words[at(g), at(j)] = u(0)
        for j in range(rows, PANEL):
            words[at(g), at(j)] = u(0)


@arithmetic
def pack_panel(codes, row0, decode, panel, words):
    """Rows row0 ... row0 + 63 of ``codes`` [N, K] (zero codes past N and K) into ``panel`` (:class:`Operand`,
    B's layout), through ``words`` (uint32 [Kp / 4, PANEL]): the codes' 4-k words transposed k-major
    (:func:`code_words`), then each group's 4 x 16 codes a vector decoded by :func:`decode_words` (``decode``:
    :class:`CodeDecode`)."""
    v = decode_vectors(decode)
    groups = words.shape[0]
    for g0 in range(0, groups, WORD_BLOCK):
        g1 = min(g0 + WORD_BLOCK, groups)
        code_words(codes, row0, words, g0, g1)
        for g in range(g0, g1):
            for column in range(0, PANEL, 16):
                decode_words(words, g, column, v, panel)


@arithmetic
def pack_panels(lo, hi, codes, decode, prepared, scratch):
    """Panels lo ... hi - 1 of B (rows ``p * PANEL ...`` of ``codes``) into ``prepared`` (:class:`Operand` of arrays
    with a leading panel axis); ``scratch``: uint32 [Kp / 4, PANEL]."""
    for p in range(lo, hi):
        pack_panel(codes, p * PANEL, decode, panel_of(prepared, p), scratch)


@arithmetic
def pack_panels_task(lo, hi, codes, decode, prepared):
    """:func:`pack_panels` with its own scratch (one task of the threads)."""
    pack_panels(lo, hi, codes, decode, prepared, np.empty((prepared.low.shape[1], PANEL), np.uint32))


@arithmetic
def panel_of(prepared, p):
    """Panel p of a prepared B."""
    return Operand(prepared.val[p], prepared.exp[p], prepared.low[p], prepared.sign[p])


@arithmetic
def pack_tiles(lo, hi, codes, tables, tiles):
    """Tiles lo ... hi - 1 of A's tile-major words ``tiles`` [A-tiles, groups, TILE_WORDS] (uint32; the module
    docstring's layout; rows and k past ``codes``: zero codes)."""
    values, exps, lows, signs = tables
    M, K = codes.shape
    u = np.uint32
    for t in range(lo, hi):
        for g in range(tiles.shape[1]):
            for r in range(ROWS):
                m = t * ROWS + r
                low, sign = u(0), u(0)
                for i in range(4):
                    k = 4 * g + i
                    c = codes[m, k] if (m < M and k < K) else np.uint8(0)
                    tiles[t, g, TILE_VALUES + ROWS * i + r] = bits_of_f32_scalar(values[c])
                    tiles[t, g, TILE_EXPONENTS + ROWS * i + r] = u(u(np.uint8(exps[c])) * u(BYTE_ONES))
                    low |= u(lows[c] << u(8 * i))
                    sign |= u(signs[c] << u(8 * i))
                tiles[t, g, TILE_LOWS + r] = low
                tiles[t, g, TILE_SIGNS + r] = sign


# ----------------------------------------------------------------------------------------------------------------
# The block step of a tile


@arithmetic
def block_vectors(constants, masks):
    """The block step's :class:`~mmaemu.arith.offset_step.StepConstants` in every lane, of
    :class:`~mmaemu.arith.offset.OffsetConstants` and :class:`BitMasks`."""
    i32 = np.int32
    return StepConstants(broadcast_i32(i32(masks.exponent_bias)), broadcast_i32(i32(constants.floor_bits)),
                         broadcast_i32(i32(constants.m_add)), broadcast_i32(i32(constants.tau_add)),
                         broadcast_i32(i32(constants.tau_max)), broadcast_i32(i32(constants.top4)),
                         broadcast_i32(i32(masks.byte_sum)), broadcast_i32(i32(masks.sign_bit)),
                         broadcast_f32(np.float32(1.0)), broadcast_i32(i32(0)),
                         broadcast_i32(i32(masks.exponent_field)), broadcast_i32(i32(constants.mantissa)))


@arithmetic
def exponent_maxima(a, row0, b_exp, g0, g1):
    """b.1 steps 1-2 by the byte exponent pass for the tile's 4 rows (``a``'s words from row ``row0``) and the
    panel's 64 columns: per row the byte-wise maxima over groups [g0, g1) of A's exponent byte plus B's
    (saturating)."""
    lowest = bytes_of_i32(broadcast_i32(np.int32(BYTES_LOWEST)))
    e0 = e1 = e2 = e3 = lowest
    for g in range(g0, g1):
        row = row0 + g
        for i in range(4):
            b = load_i8(b_exp, 4 * g + i, 0)
            e = TILE_EXPONENTS + ROWS * i
            e0 = max_i8(e0, add_saturated_i8(bytes_of_i32(broadcast_load_i32(a, row, e)), b))
            e1 = max_i8(e1, add_saturated_i8(bytes_of_i32(broadcast_load_i32(a, row, e + 1)), b))
            e2 = max_i8(e2, add_saturated_i8(bytes_of_i32(broadcast_load_i32(a, row, e + 2)), b))
            e3 = max_i8(e3, add_saturated_i8(bytes_of_i32(broadcast_load_i32(a, row, e + 3)), b))
    return e0, e1, e2, e3


@arithmetic
def vector_start(e, c, v):
    """:func:`mmaemu.arith.offset_step.step_start` on one vector, E_prod from its byte pass maximum ``e`` (int32
    lanes; :func:`mmaemu.arith.offset.exponent_bytes`): the offset sum and the threshold word."""
    return step_start(add_i32(shl_i32(e, FP32_FRACTION_BITS), v.exponent_bias), c, v, True)


@arithmetic
def vector_end(s, n, v):
    """:func:`mmaemu.arith.offset_step.step_end` on one vector, the count n the sum of its four byte counters
    (``n * 0x01010101 >> 24``)."""
    return step_end(s, lshr_i32(mul_i32(n, v.byte_sum), 24), v)


@arithmetic
def row_start(e, c_val, r, column, v):
    """:func:`vector_start` for the two vectors of row r of a sub-tile (``e``: their exponent maxima)."""
    s0, t0 = vector_start(e[0], load_f32(c_val, r, column), v)
    s1, t1 = vector_start(e[1], load_f32(c_val, r, column + 16), v)
    return (s0, s1), (t0, t1)


@arithmetic
def row_end(s, n, c_val, r, column, v):
    """:func:`vector_end` for the two vectors of row r of a sub-tile, into ``c_val[r]``."""
    store_f32(c_val, r, column, vector_end(s[0], n[0], v))
    store_f32(c_val, r, column + 16, vector_end(s[1], n[1], v))


@arithmetic
def row_products(a, row, word, b0, b1, s):
    """One k of a row of a sub-tile: ``a * b + S`` rounded toward zero, both vectors (A's value: word ``word`` of
    ``a``'s row ``row``)."""
    value = f32_of_bits(broadcast_load_i32(a, row, word))
    return fma_toward_zero_f32(value, b0, s[0]), fma_toward_zero_f32(value, b1, s[1])


@arithmetic
def row_count(a, row, r, low0, low1, sign0, sign1, t, n):
    """The byte counters of one 4-k group of row r of the tile (``a``'s words of the group: row ``row``):
    :func:`mmaemu.arith.offset_step.correction_flags`' bit 7 shifted to bit 0 of its byte and added, both
    vectors."""
    low_a, sign_a = broadcast_load_i32(a, row, TILE_LOWS + r), broadcast_load_i32(a, row, TILE_SIGNS + r)
    flags0 = correction_flags(low_a, low0, sign_a, sign0, t[0])
    flags1 = correction_flags(low_a, low1, sign_a, sign1, t[1])
    return add_i32(n[0], lshr_i32(flags0, 7)), add_i32(n[1], lshr_i32(flags1, 7))


@arithmetic
def subtile_group(a, row0, b, column, g, s, t, n):
    """Four k (group g) of the sub-tile: 32 fused multiply-adds rounding toward zero (each B vector loaded once
    for the four rows) and the byte counters; A's words of the group: ``a``'s row ``row0 + g``."""
    s0, s1, s2, s3 = s
    k = 4 * g
    row = row0 + g
    low0, low1 = load_u32(b.low, g, column), load_u32(b.low, g, column + 16)
    sign0, sign1 = load_u32(b.sign, g, column), load_u32(b.sign, g, column + 16)
    for i in range(4):
        b0, b1 = load_f32(b.val, k + i, column), load_f32(b.val, k + i, column + 16)
        word = TILE_VALUES + ROWS * i
        s0 = row_products(a, row, word, b0, b1, s0)
        s1 = row_products(a, row, word + 1, b0, b1, s1)
        s2 = row_products(a, row, word + 2, b0, b1, s2)
        s3 = row_products(a, row, word + 3, b0, b1, s3)
    n0 = row_count(a, row, 0, low0, low1, sign0, sign1, t[0], n[0])
    n1 = row_count(a, row, 1, low0, low1, sign0, sign1, t[1], n[1])
    n2 = row_count(a, row, 2, low0, low1, sign0, sign1, t[2], n[2])
    n3 = row_count(a, row, 3, low0, low1, sign0, sign1, t[3], n[3])
    return (s0, s1, s2, s3), (n0, n1, n2, n3)


@arithmetic_inlined
def subtile_block(a, row0, b, column, g0, g1, e, v, c_val):
    """The block step's start, products (groups g0 ... g1 - 1) and end for the sub-tile of columns ``column ...
    column + 31`` (``e``: per row the pair of exponent maxima of its vectors); ``c_val`` [ROWS, PANEL] in place."""
    s0, t0 = row_start(e[0], c_val, 0, column, v)
    s1, t1 = row_start(e[1], c_val, 1, column, v)
    s2, t2 = row_start(e[2], c_val, 2, column, v)
    s3, t3 = row_start(e[3], c_val, 3, column, v)
    s, t = (s0, s1, s2, s3), (t0, t1, t2, t3)
    zeros = (v.zero, v.zero)
    n = (zeros, zeros, zeros, zeros)
    for g in range(g0, g1):
        s, n = subtile_group(a, row0, b, column, g, s, t, n)
    row_end(s[0], n[0], c_val, 0, column, v)
    row_end(s[1], n[1], c_val, 1, column, v)
    row_end(s[2], n[2], c_val, 2, column, v)
    row_end(s[3], n[3], c_val, 3, column, v)


@arithmetic
def tile_chain(a, row0, b, K, first, stride, count, schedule, constants, v, c_val, work):
    """One chain from +0 over ``count`` k-tiles (``chain_range``) for the 4 rows of a tile of A and the panel
    ``b``; ``c_val`` [ROWS, PANEL] ends with its deferred accumulator. ``a``: A's tile-major words
    (:func:`pack_tiles`) as rows of TILE_WORDS, the tile's groups from row ``row0``.

    Blocks start every nfma k from each range's start. A block over [kb, ke) with kb < K is one early-accumulator
    block step (b.1, truncation deferred): the byte exponent pass, then the two sub-tiles (:func:`subtile_block`);
    kb is a multiple of K_PASS and the packed operands hold zero codes from ke up to the next multiple of K_PASS
    (:func:`~mmaemu.arith.offset.block_range`). Blocks past K run on the accumulator alone. The block steps run in
    a toward-zero region (:func:`mmaemu.cpu.simd.enter_toward_zero`: MXCSR on AVX2, nothing on AVX-512), which the
    empty blocks (their float64 emulation of the FMA needs rounding to nearest) and the chain's caller (the split
    combination) stay out of. Why the block loop is here and not in a function per block: a call of a Numba
    function with arrays increments and decrements their reference counts (atomics, on the lines that every
    thread shares), 12 per block when it was one (docs/performance.md)."""
    nfma = constants.nfma
    clear_tile(c_val)
    saved = enter_toward_zero()
    for i in range(chain_range_count(stride, count)):
        k0, k1 = chain_range(K, first, stride, count, schedule.tile, schedule.padded, i)
        for kb in range(k0, k1, nfma):
            if kb < K:
                start, end = block_range(np.uint32(kb), np.uint32(min(kb + nfma, k1, K)))
                g0, g1 = start >> np.uint32(2), end >> np.uint32(2)
                e0, e1, e2, e3 = exponent_maxima(a, row0, b.exp, g0, g1)
                subtile_block(a, row0, b, 0, g0, g1,
                              ((widen_i8(e0, 0), widen_i8(e0, 1)), (widen_i8(e1, 0), widen_i8(e1, 1)),
                               (widen_i8(e2, 0), widen_i8(e2, 1)), (widen_i8(e3, 0), widen_i8(e3, 1))), v, c_val)
                subtile_block(a, row0, b, SUBTILE, g0, g1,
                              ((widen_i8(e0, 2), widen_i8(e0, 3)), (widen_i8(e1, 2), widen_i8(e1, 3)),
                               (widen_i8(e2, 2), widen_i8(e2, 3)), (widen_i8(e3, 2), widen_i8(e3, 3))), v, c_val)
            else:
                leave_toward_zero(saved)
                offset_empty_block(constants, c_val, work)
                saved = enter_toward_zero()
    leave_toward_zero(saved)


@arithmetic
def tile_accumulate(a, row0, b, K, schedule, constants, v, work, sums):
    """:func:`mmaemu.arith.schedule.accumulate_one` for the tile: ``acc[r, j]`` (of ``sums`` = (c_val, partial,
    acc, slot), float32 [ROWS, PANEL]) = the fp32 accumulator of output (row r of the tile whose words start at
    ``a``'s row ``row0``, column j)."""
    c_val, partial, acc, slot = sums
    splits, pairwise = schedule.splits, schedule.pairwise
    clear_tile(acc)
    clear_tile(slot)
    for i in range(splits):
        s, target, flush = combine_step(splits, pairwise, i)
        clear_tile(partial)
        for c in range(split_chains(K, s, schedule)):
            first, stride, n = chain_tiles_of(K, s, c, schedule)
            tile_chain(a, row0, b, K, first, stride, n, schedule, constants, v, c_val, work)
            add_chain_values(partial, c_val, constants.frac_out)
        combine_tile(acc, slot, partial, target, flush)


@arithmetic
def offset_panel_rows(m_lo, m_hi, a, b, n0, K, schedule, constants, masks, out):
    """out[m, n0:n0+PANEL] = fp32 accumulators of rows m_lo .. m_hi-1 of A and one packed panel of B (finite
    codes), bit-identical to ``accumulate_codes(..., reference=True)``. ``a``: A packed (:func:`pack_tiles`, as
    uint32 [A-tiles * groups, TILE_WORDS]), ``b``: the panel (:class:`Operand`); m_lo a multiple of ROWS. ``constants``: the
    :class:`~mmaemu.arith.offset.OffsetConstants` of the call (add-max); ``schedule`` as ``accumulate_one`` takes it
    (:class:`~mmaemu.arith.params.Schedule`); ``masks``: :data:`MASKS`."""
    v = block_vectors(constants, masks)
    shape = (ROWS, PANEL)
    work = (np.empty(shape, np.uint32), np.empty(shape, np.float32), np.empty(shape, np.uint32),
            np.empty(shape, np.uint32))
    sums = (np.empty(shape, np.float32), np.empty(shape, np.float32), np.empty(shape, np.float32),
            np.empty(shape, np.float32))
    acc = sums[2]
    N = out.shape[1]
    groups = b.low.shape[0]
    for r0 in range(m_lo, m_hi, ROWS):
        tile_accumulate(a, (r0 // ROWS) * groups, b, K, schedule, constants, v, work, sums)
        for r in range(min(ROWS, m_hi - r0)):
            for j in range(min(PANEL, N - n0)):
                out[r0 + r, n0 + j] = acc[r, j]


@arithmetic
def offset_prepared_task(p_lo, p_hi, m_lo, m_hi, a, prepared, K, schedule, constants, masks, out):
    """One task of the engine on a prepared B: panels p_lo ... p_hi - 1 against rows m_lo ... m_hi - 1."""
    for p in range(p_lo, p_hi):
        offset_panel_rows(m_lo, m_hi, a, panel_of(prepared, p), p * PANEL, K, schedule, constants, masks, out)


@arithmetic
def offset_codes_task(p_lo, p_hi, m_lo, m_hi, a, codes, decode, K, schedule, constants, masks, out):
    """One task of the engine on B's codes: each of panels p_lo ... p_hi - 1 packed into the task's own panel
    (:func:`pack_panel`), then computed against rows m_lo ... m_hi - 1."""
    kp = padded_k(K)
    panel = Operand(np.empty((kp, PANEL), np.float32), np.empty((kp, PANEL), np.int8),
                    np.empty((kp // 4, PANEL), np.uint32), np.empty((kp // 4, PANEL), np.uint32))
    scratch = np.empty((kp // 4, PANEL), np.uint32)
    for p in range(p_lo, p_hi):
        pack_panel(codes, p * PANEL, decode, panel, scratch)
        offset_panel_rows(m_lo, m_hi, a, panel, p * PANEL, K, schedule, constants, masks, out)

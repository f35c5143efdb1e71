"""The offset engine's block step for ONE row of A at a time: the kept call of a decoding step (M = 1 and a few rows,
:data:`mmaemu.cpu.fused.ROW_KERNEL_ROWS`) on a kept B's packed panels (:class:`mmaemu.cpu.offset_engine.PreparedB`).

The offset kernel's tile (:mod:`.offset_kernel`) is 4 rows of A times a panel of 64 columns: at M = 1 three of its
rows are zero codes, and a call of one row costs what a call of four does (measured: 71 us for (1, 576, 576) and 70
us for (4, 576, 576), one thread, the 2-core Zen 4; docs/performance.md, "One row of A on the offset method"). A
*row tile* here is one row times the panel's 64 columns, four vectors of 16 lanes: per block its exponent pass is
one saturating byte add and one byte maximum per k for the 64 outputs (two independent maxima, even and odd k, so
that the maxima do not wait on each other), its products one fused multiply-add rounding toward zero per k and
vector, and its count one 4-k group's correction flags per vector. The arithmetic is the offset kernel's, unchanged
and shared: the start and the end of a block (:func:`~.offset_kernel.vector_start`, :func:`~.offset_kernel.
vector_end`), the correction flags (:func:`mmaemu.arith.offset_step.correction_flags`), the empty block, the chain's
end and the split-K skeleton; A is packed tile-major by :func:`~.offset_kernel.pack_tiles` (row r of a tile reads
the words of row r), B's panels are the offset engine's (7 bytes per code). The proofs of :mod:`mmaemu.arith.offset`
hold lane by lane, as for the 4-row tile: what differs is only which lanes run together.

:func:`rows_call` is a whole kept call in one compiled call: the comparison of B's codes with the kept copy (and the
NaN/Inf flags of B's rows, in the same pass), A's packing and NaN/Inf flags, the products of every row and panel,
then the NaN/Inf rule and the epilogue (:func:`mmaemu.cpu.finish.finish_block`). Imported only where the offset
engine runs (:func:`mmaemu.cpu.features.offset_engine_decline`), as :mod:`.offset_kernel` is.

The block-wise recipe's kept decoding call runs on the same row chain (:func:`row_chain`, one chain from +0 per
128-k chunk: :func:`mmaemu.cpu.offset_chunked.chunked_row`), with the same packing (:func:`packed_rows`), the same
comparison of B's codes and the constants of :func:`call_words` with its own words after them.
"""

import numpy as np

from ..base._jit import arithmetic, arithmetic_inlined
from ..arith.chain import chain_range, chain_range_count
from ..arith.offset import OffsetConstants, add_chain_values, block_range, offset_empty_block
from ..arith.params import Schedule
from ..arith.offset_step import correction_flags
from ..arith.schedule import chain_tiles_of, clear_tile, combine_step, combine_tile, split_chains
from .finish import finish_block
from .gemm import nonfinite_rows
from .offset_kernel import (BYTES_LOWEST, PANEL, ROWS, TILE_EXPONENTS, TILE_LOWS, TILE_SIGNS, TILE_VALUES,
                            TILE_WORDS, BitMasks, Operand, block_vectors, pack_tiles, panel_of, vector_end,
                            vector_start)
from .simd import (add_i32, add_saturated_i8, broadcast_i32, broadcast_load_i32, bytes_of_i32, enter_toward_zero,
                   f32_of_bits, fma_toward_zero_f32, leave_toward_zero, load_f32, load_i8, load_u32, lshr_i32,
                   max_i8, store_f32, widen_i8)


@arithmetic
def row_exponent_maximum(a, row0, r, b_exp, g0, g1):
    """b.1 steps 1-2 by the byte exponent pass (:func:`mmaemu.arith.offset.exponent_bytes`) for row r of the tile
    whose words start at ``a``'s row ``row0`` and the panel's 64 columns: the byte-wise maximum over the k of groups
    [g0, g1) of A's exponent byte plus B's (saturating), kept as two maxima (even and odd k) joined at the end."""
    lowest = bytes_of_i32(broadcast_i32(np.int32(BYTES_LOWEST)))
    even = odd = lowest
    for g in range(g0, g1):
        row = row0 + g
        k = 4 * g
        even = max_i8(even, add_saturated_i8(bytes_of_i32(broadcast_load_i32(a, row, TILE_EXPONENTS + r)),
                                             load_i8(b_exp, k, 0)))
        odd = max_i8(odd, add_saturated_i8(bytes_of_i32(broadcast_load_i32(a, row, TILE_EXPONENTS + ROWS + r)),
                                           load_i8(b_exp, k + 1, 0)))
        even = max_i8(even, add_saturated_i8(bytes_of_i32(broadcast_load_i32(a, row, TILE_EXPONENTS + 2 * ROWS + r)),
                                             load_i8(b_exp, k + 2, 0)))
        odd = max_i8(odd, add_saturated_i8(bytes_of_i32(broadcast_load_i32(a, row, TILE_EXPONENTS + 3 * ROWS + r)),
                                           load_i8(b_exp, k + 3, 0)))
    return max_i8(even, odd)


@arithmetic
def row_vector_count(low_a, sign_a, b, g, column, t, n):
    """The byte counter of one 4-k group (g) and the vector of columns ``column ... column + 15``: the correction
    flags' bit 7 shifted to bit 0 of its byte and added to ``n``."""
    flags = correction_flags(low_a, load_u32(b.low, g, column), sign_a, load_u32(b.sign, g, column), t)
    return add_i32(n, lshr_i32(flags, 7))


@arithmetic_inlined
def row_block(a, row0, r, b, g0, g1, e, v, c_val):
    """The block step's start, products (groups g0 ... g1 - 1) and end for row r of the tile and the panel's 64
    columns (``e``: the exponent bytes of :func:`row_exponent_maximum`); ``c_val`` [1, PANEL] in place."""
    s0, t0 = vector_start(widen_i8(e, 0), load_f32(c_val, 0, 0), v)
    s1, t1 = vector_start(widen_i8(e, 1), load_f32(c_val, 0, 16), v)
    s2, t2 = vector_start(widen_i8(e, 2), load_f32(c_val, 0, 32), v)
    s3, t3 = vector_start(widen_i8(e, 3), load_f32(c_val, 0, 48), v)
    n0 = n1 = n2 = n3 = v.zero
    for g in range(g0, g1):
        row = row0 + g
        k = 4 * g
        for i in range(4):
            value = f32_of_bits(broadcast_load_i32(a, row, TILE_VALUES + ROWS * i + r))
            s0 = fma_toward_zero_f32(value, load_f32(b.val, k + i, 0), s0)
            s1 = fma_toward_zero_f32(value, load_f32(b.val, k + i, 16), s1)
            s2 = fma_toward_zero_f32(value, load_f32(b.val, k + i, 32), s2)
            s3 = fma_toward_zero_f32(value, load_f32(b.val, k + i, 48), s3)
        low_a, sign_a = broadcast_load_i32(a, row, TILE_LOWS + r), broadcast_load_i32(a, row, TILE_SIGNS + r)
        n0 = row_vector_count(low_a, sign_a, b, g, 0, t0, n0)
        n1 = row_vector_count(low_a, sign_a, b, g, 16, t1, n1)
        n2 = row_vector_count(low_a, sign_a, b, g, 32, t2, n2)
        n3 = row_vector_count(low_a, sign_a, b, g, 48, t3, n3)
    store_f32(c_val, 0, 0, vector_end(s0, n0, v))
    store_f32(c_val, 0, 16, vector_end(s1, n1, v))
    store_f32(c_val, 0, 32, vector_end(s2, n2, v))
    store_f32(c_val, 0, 48, vector_end(s3, n3, v))


@arithmetic
def row_chain(a, row0, r, b, K, first, stride, count, schedule, constants, v, c_val, work):
    """:func:`mmaemu.cpu.offset_kernel.tile_chain` for row r of the tile: one chain from +0, ``c_val`` [1, PANEL]
    ends with its deferred accumulator; the block steps inside a toward-zero region, the empty blocks outside."""
    nfma = constants.nfma
    clear_tile(c_val)
    saved = enter_toward_zero()
    for i in range(chain_range_count(stride, count)):
        k0, k1 = chain_range(K, first, stride, count, schedule.tile, schedule.padded, i)
        for kb in range(k0, k1, nfma):
            if kb < K:
                start, end = block_range(np.uint32(kb), np.uint32(min(kb + nfma, k1, K)))
                g0, g1 = start >> np.uint32(2), end >> np.uint32(2)
                row_block(a, row0, r, b, g0, g1, row_exponent_maximum(a, row0, r, b.exp, g0, g1), v, c_val)
            else:
                leave_toward_zero(saved)
                offset_empty_block(constants, c_val, work)
                saved = enter_toward_zero()
    leave_toward_zero(saved)


@arithmetic
def row_accumulate(a, row0, r, b, K, schedule, constants, v, work, sums):
    """:func:`mmaemu.arith.schedule.accumulate_one` for row r of the tile: ``sums[2][0, j]`` (``sums`` = (c_val,
    partial, acc, slot), float32 [1, PANEL]) = the fp32 accumulator of column j of the panel."""
    c_val, partial, acc, slot = sums
    splits, pairwise = schedule.splits, schedule.pairwise
    clear_tile(acc)
    clear_tile(slot)
    for i in range(splits):
        s, target, flush = combine_step(splits, pairwise, i)
        clear_tile(partial)
        for c in range(split_chains(K, s, schedule)):
            first, stride, n = chain_tiles_of(K, s, c, schedule)
            row_chain(a, row0, r, b, K, first, stride, n, schedule, constants, v, c_val, work)
            add_chain_values(partial, c_val, constants.frac_out)
        combine_tile(acc, slot, partial, target, flush)


@arithmetic
def packed_rows(a_codes, a_tables, groups):
    """A's codes [M, K] packed tile-major (:func:`~.offset_kernel.pack_tiles` with ``a_tables``, the offset
    engine's :func:`~mmaemu.cpu.offset_engine.packing_tables`) for a B of ``groups`` 4-k groups: uint32
    [tiles * groups, TILE_WORDS], row r of tile t read from word row ``t * groups`` on."""
    tiles = (a_codes.shape[0] + ROWS - 1) // ROWS
    packed = np.empty((tiles, groups, TILE_WORDS), np.uint32)
    pack_tiles(0, tiles, a_codes, a_tables, packed)
    return packed.reshape(tiles * groups, TILE_WORDS)


@arithmetic
def row_work():
    """The scratch of :func:`row_chain`'s empty blocks (:func:`mmaemu.arith.offset.offset_empty_block`), [1, PANEL]."""
    shape = (1, PANEL)
    return (np.empty(shape, np.uint32), np.empty(shape, np.float32), np.empty(shape, np.uint32),
            np.empty(shape, np.uint32))


@arithmetic
def row_accumulators(a_codes, a_tables, prepared, K, schedule, constants, masks, acc):
    """``acc`` [M, N] = the fp32 accumulators of A's codes [M, K] times the prepared B (finite codes), row tile by
    row tile: A packed tile-major here (:func:`~.offset_kernel.pack_tiles` with ``a_tables``, the offset engine's
    :func:`~mmaemu.cpu.offset_engine.packing_tables`), then every panel against every row."""
    M = a_codes.shape[0]
    N = acc.shape[1]
    groups = prepared.low.shape[1]
    a = packed_rows(a_codes, a_tables, groups)
    v = block_vectors(constants, masks)
    work = row_work()
    shape = (1, PANEL)
    sums = (np.empty(shape, np.float32), np.empty(shape, np.float32), np.empty(shape, np.float32),
            np.empty(shape, np.float32))
    row_acc = sums[2]
    for p in range(prepared.val.shape[0]):
        panel = panel_of(prepared, p)
        n0 = p * PANEL
        for m in range(M):
            row_accumulate(a, (m // ROWS) * groups, m % ROWS, panel, K, schedule, constants, v, work, sums)
            for j in range(min(PANEL, N - n0)):
                acc[m, n0 + j] = row_acc[0, j]


@arithmetic
def same_codes_flags(kept, codes, mask, pattern, flags):
    """Whether ``codes`` [N, K] (uint8, C-contiguous) holds the bytes of ``kept`` (flat, N * K), and, where it does,
    ``flags[n]`` = row n holds a NaN or Inf code (``code & mask == pattern``, nonfinite.NONFINITE_PATTERN), in one pass
    row by row (a difference stops it at the end of its row). Rows of whole 8-byte words are read as uint64 words
    (:func:`nonfinite_word`), others byte by byte."""
    N, K = codes.shape
    if K % 8 == 0 and pattern == mask and mask < 0x80:
        words = K // 8
        flat = codes.reshape(N * K).view(np.uint64)
        kept_words = kept.view(np.uint64)
        ones = np.uint64(0x0101010101010101)
        mask_words, add_words = np.uint64(mask) * ones, np.uint64(0x80 - mask) * ones
        u = np.uint64  # unsigned indices: no negative-index wrap, so that the loop vectorises
        for n in range(N):
            diff = hit = u(0)
            i, end = u(n) * u(words), u(n + 1) * u(words)
            while i < end:
                w = flat[i]
                diff |= w ^ kept_words[i]
                hit |= nonfinite_word(w, mask_words, add_words)
                i += u(1)
            if diff != np.uint64(0):
                return False
            flags[n] = hit != np.uint64(0)
        return True
    for n in range(N):
        diff, hit = 0, False
        for k in range(K):
            c = codes[n, k]
            diff |= c ^ kept[n * K + k]
            hit |= (c & mask) == pattern
        if diff != 0:
            return False
        flags[n] = hit
    return True


@arithmetic
def nonfinite_word(w, mask_words, add_words):
    """Bit 7 of each byte of the uint64 word ``w`` of codes set iff that code is NaN or Inf (``code & mask ==
    mask``; ``mask_words``: mask in every byte, ``add_words``: ``0x80 - mask`` in every byte, mask < 0x80). Why it
    is exact: a byte ``x = code & mask`` holds only mask's bits, so x <= mask, and ``x + 0x80 - mask`` reaches 0x80
    (bit 7) iff x = mask; the sum is at most 0x80, so nothing carries into the next byte."""
    return ((w & mask_words) + add_words) & np.uint64(0x8080808080808080)


# The constants of a kept call in one int64 array (one argument of :func:`rows_call`: a Numba call with named tuples
# of arguments cost about 10 us more to dispatch than with plain arrays, measured): where each part starts.
CALL_OFFSET = 0  # mmaemu.arith.offset.OffsetConstants (10)
CALL_SCHEDULE = 10  # mmaemu.arith.params.Schedule (6)
CALL_MASKS = 16  # mmaemu.cpu.offset_kernel.BitMasks (4)
CALL_A_NONFINITE = 20  # mask, pattern of A's NaN/Inf codes
CALL_B_NONFINITE = 22
CALL_K = 24
CALL_OUT_CODE = 25
CALL_WORDS = 26


def call_words(constants, schedule, masks, a_nonfinite, b_nonfinite, K, out_code, extra=()) -> np.ndarray:
    """The int64 array of a kept call's constants (read-only) that :func:`rows_call` takes apart again; ``extra``:
    words of a caller's own after them, from CALL_WORDS on (:func:`mmaemu.cpu.offset_chunked.chunked_rows_call`)."""
    words = np.array(list(constants) + list(schedule) + list(masks) + list(a_nonfinite) + list(b_nonfinite)
                     + [K, out_code] + list(extra), np.int64)
    assert words.shape == (CALL_WORDS + len(extra),) and len(constants) == CALL_SCHEDULE - CALL_OFFSET
    words.setflags(write=False)
    return words


@arithmetic
def call_parts(c):
    """The offset constants, the schedule and the bit masks of :func:`call_words`' array ``c``."""
    o, s, m = CALL_OFFSET, CALL_SCHEDULE, CALL_MASKS
    constants = OffsetConstants(c[o], c[o + 1], c[o + 2], c[o + 3], c[o + 4], c[o + 5], c[o + 6], c[o + 7], c[o + 8],
                                c[o + 9])
    return (constants, Schedule(c[s], c[s + 1], c[s + 2], c[s + 3], c[s + 4], c[s + 5]),
            BitMasks(c[m], c[m + 1], c[m + 2], c[m + 3]))


@arithmetic
def kept_call_flags(words, kept_codes, b_codes, a_codes):
    """The start of a kept call on row tiles: ``(same, a_flags, b_flags)``, whether ``b_codes`` [N, K] hold the
    bytes of ``kept_codes`` and, where they do, per row of A and of B whether it holds a NaN or Inf code (the masks
    and patterns of :func:`call_words`' array ``words``)."""
    c = words
    b_flags = np.zeros(b_codes.shape[0], np.bool_)
    a_flags = np.zeros(a_codes.shape[0], np.bool_)
    if not same_codes_flags(kept_codes, b_codes, c[CALL_B_NONFINITE], c[CALL_B_NONFINITE + 1], b_flags):
        return False, a_flags, b_flags
    nonfinite_rows(0, a_codes.shape[0], a_codes, c[CALL_A_NONFINITE], c[CALL_A_NONFINITE + 1], a_flags)
    return True, a_flags, b_flags


@arithmetic
def rows_call(words, kept_codes, b_codes, b_val, b_exp, b_low, b_sign, a_codes, a_values, a_exps, a_lows, a_signs,
              a_table, b_table, scales, acc, out_bits):
    """A whole kept call on row tiles: False (nothing computed) unless ``b_codes`` are byte-identical to
    ``kept_codes``, the codes that the packed panels (``b_val`` ... ``b_sign``: the offset engine's
    :class:`~mmaemu.cpu.offset_engine.PreparedB`) were packed from; else the accumulators (:func:`row_accumulators`;
    ``a_values`` ... ``a_signs``: A's packing tables), the NaN/Inf rule (``a_table``, ``b_table``: the float64
    values of the codes) and the epilogue with the scales' bits ``scales`` into ``out_bits``
    (:func:`mmaemu.cpu.finish.finish_block`), and True. ``words``: :func:`call_words`."""
    c = words
    constants, schedule, masks = call_parts(words)
    M = a_codes.shape[0]
    N = b_codes.shape[0]
    same, a_flags, b_flags = kept_call_flags(words, kept_codes, b_codes, a_codes)
    if not same:
        return False
    row_accumulators(a_codes, (a_values, a_exps, a_lows, a_signs), Operand(b_val, b_exp, b_low, b_sign), c[CALL_K],
                     schedule, constants, masks, acc)
    finish_block(0, M, 0, N, a_codes, a_flags, a_table, b_codes, b_flags, b_table, acc, acc.view(np.int32), scales,
                 c[CALL_OUT_CODE], out_bits)
    return True

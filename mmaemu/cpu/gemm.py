"""CPU loops over the compiled arithmetic, each on a range of jobs ``[lo, hi)`` (a task of
:mod:`mmaemu.cpu.threads`, which runs the tasks of a call on its threads; the loops release the GIL).

* :func:`accumulate_panel_rows` - the fast path. B is cut into *panels* of ``lanes`` rows (columns of the
  product), each decoded once into the tile layout of :mod:`mmaemu.arith.tile` ([K, lanes]: fp32 value and int8
  exponent per code, :func:`decode_panel`); a task is one decoded panel and a range of rows of A, ``tile_rows`` at
  a time: decode them (:func:`decode_rows`) and run :func:`mmaemu.arith.tile.tile_accumulate`, whose innermost
  loops run over the lanes and vectorise. Every row of A is decoded once per panel.
* :func:`accumulate_gemm_reference` - the straightforward loop: every output walks its chains alone with
  :func:`mmaemu.arith.schedule.accumulate_one`, the reference every fast path is tested against.

Extra memory of the fast path: the [M, N] output, the decoded panels in use (K x lanes x 5 bytes each, about one
per thread: :class:`mmaemu.cpu.engine.DecodedPanels`) and, per task, the decoded rows (tile_rows x K x 5 bytes)
and nine tile_rows x lanes work arrays of 2 to 8 bytes: O(M*N + threads * K * (lanes + tile_rows)). Nothing is
decoded for the whole of A or B.
"""

import numpy as np

from ..base._jit import arithmetic
from ..arith.epilogue import epilogue_span
from ..arith.schedule import accumulate_one
from ..arith.special import FINITE, nonfinite_accumulator
from ..arith.tile import tile_accumulate, tile_decode

TILE_M = 16
TILE_N = 16


@arithmetic
def output_tile(job, M, N):
    """The outputs of reference job ``job``: rows m0 .. m1-1 and columns n0 .. n1-1 (returned as m0, m1, n0, n1)
    of the tile of TILE_M x TILE_N outputs it is, the tiles of [M, N] taken row-major."""
    tiles_n = (N + TILE_N - 1) // TILE_N
    m0 = (job // tiles_n) * TILE_M
    n0 = (job % tiles_n) * TILE_N
    return m0, min(m0 + TILE_M, M), n0, min(n0 + TILE_N, N)


@arithmetic
def accumulate_gemm_reference(lo, hi, sa, ea, sb, eb, schedule, params, out):
    """out[m, n] = fp32 accumulator of row m of A and row n of B (finite codes; semantics.md (c), (d)), for the
    outputs of jobs lo .. hi-1 (a job: a tile of TILE_M x TILE_N outputs, row-major over the tiles).

    ``sa``/``ea``, ``sb``/``eb``: int8 significands and int16 exponents (:func:`mmaemu.cpu.engine.decode_operand`).
    """
    M, K = sa.shape
    N = sb.shape[0]
    for job in range(lo, hi):
        m0, m1, n0, n1 = output_tile(job, M, N)
        for m in range(m0, m1):
            for n in range(n0, n1):
                out[m, n] = accumulate_one(sa[m], ea[m], sb[n], eb[n], K, schedule, params)


@arithmetic
def decode_rows(codes, m0, rows, fmt, val, exp):
    """Rows m0 .. m0+rows-1 of A in the tile layout: ``val[r, k]``, ``exp[r, k]`` (mmaemu.arith.tile.tile_decode)."""
    K = codes.shape[1]
    for r in range(rows):
        for k in range(K):
            val[r, k], exp[r, k] = tile_decode(codes[m0 + r, k], fmt)


@arithmetic
def decode_panel(codes, n0, val_table, exp_table, nonfinite_table, val, exp, flags):
    """Rows n0 .. n0+lanes-1 of B (columns of the product) transposed into the tile layout ``val[k, j]``,
    ``exp[k, j]``; lanes past the last row are zero codes. ``val_table``/``exp_table``: tile_decode of the 256
    codes (engine.tile_tables). Eight rows of codes are read side by side, so that each k writes 8 adjacent
    lanes. The same pass finds the rows holding a NaN or Inf code: ``flags[n]`` (n = n0 .. n0+lanes-1, n < N)
    is set to whether row n holds a code whose ``nonfinite_table`` entry is 1."""
    N, K = codes.shape
    lanes = val.shape[1]
    flat_val = val.reshape(K * lanes)
    flat_exp = exp.reshape(K * lanes)
    j = 0
    while j + 8 <= lanes and n0 + j + 8 <= N:
        r0, r1, r2, r3 = codes[n0 + j], codes[n0 + j + 1], codes[n0 + j + 2], codes[n0 + j + 3]
        r4, r5, r6, r7 = codes[n0 + j + 4], codes[n0 + j + 5], codes[n0 + j + 6], codes[n0 + j + 7]
        h0 = h1 = h2 = h3 = h4 = h5 = h6 = h7 = np.uint8(0)
        for k in range(K):
            i = k * lanes + j
            c = r0[k]
            flat_val[i], flat_exp[i] = val_table[c], exp_table[c]
            h0 |= nonfinite_table[c]
            c = r1[k]
            flat_val[i + 1], flat_exp[i + 1] = val_table[c], exp_table[c]
            h1 |= nonfinite_table[c]
            c = r2[k]
            flat_val[i + 2], flat_exp[i + 2] = val_table[c], exp_table[c]
            h2 |= nonfinite_table[c]
            c = r3[k]
            flat_val[i + 3], flat_exp[i + 3] = val_table[c], exp_table[c]
            h3 |= nonfinite_table[c]
            c = r4[k]
            flat_val[i + 4], flat_exp[i + 4] = val_table[c], exp_table[c]
            h4 |= nonfinite_table[c]
            c = r5[k]
            flat_val[i + 5], flat_exp[i + 5] = val_table[c], exp_table[c]
            h5 |= nonfinite_table[c]
            c = r6[k]
            flat_val[i + 6], flat_exp[i + 6] = val_table[c], exp_table[c]
            h6 |= nonfinite_table[c]
            c = r7[k]
            flat_val[i + 7], flat_exp[i + 7] = val_table[c], exp_table[c]
            h7 |= nonfinite_table[c]
        flags[n0 + j], flags[n0 + j + 1], flags[n0 + j + 2], flags[n0 + j + 3] = h0 != 0, h1 != 0, h2 != 0, h3 != 0
        flags[n0 + j + 4], flags[n0 + j + 5], flags[n0 + j + 6], flags[n0 + j + 7] = (h4 != 0, h5 != 0, h6 != 0,
                                                                                      h7 != 0)
        j += 8
    while j < lanes:
        if n0 + j < N:
            row = codes[n0 + j]
            hit = np.uint8(0)
            for k in range(K):
                c = row[k]
                flat_val[k * lanes + j], flat_exp[k * lanes + j] = val_table[c], exp_table[c]
                hit |= nonfinite_table[c]
            flags[n0 + j] = hit != 0
        else:
            for k in range(K):
                flat_val[k * lanes + j], flat_exp[k * lanes + j] = val_table[0], exp_table[0]
        j += 1


@arithmetic
def decode_panels(lo, hi, codes, val_table, exp_table, nonfinite_table, val, exp, flags):
    """Panels lo .. hi-1 of B decoded by :func:`decode_panel` into ``val[p]``, ``exp[p]`` ([panels, K, lanes]),
    with the NaN/Inf flags of their rows."""
    lanes = val.shape[2]
    for p in range(lo, hi):
        decode_panel(codes, p * lanes, val_table, exp_table, nonfinite_table, val[p], exp[p], flags)


@arithmetic
def decoded_rows_arrays(tile_rows, K):
    """A task's buffers for ``tile_rows`` decoded rows of A in the tile layout: (val fp32, exp int8) [tile_rows, K]."""
    return np.empty((tile_rows, K), np.float32), np.empty((tile_rows, K), np.int8)


@arithmetic
def tile_work(tile_rows, lanes, lane_proto):
    """A task's work arrays of a tile's chains, (c_sig, c_lead, e_max, scale, total) [tile_rows, lanes] of dtypes
    (lane int, int32, int16, float32, lane int), the lane int being ``lane_proto``'s dtype: the ``work`` of
    :func:`mmaemu.arith.tile.tile_accumulate` and of the block-scaled tile chains (mmaemu.arith.block_scaled)."""
    shape = (tile_rows, lanes)
    return (np.empty(shape, lane_proto.dtype), np.empty(shape, np.int32), np.empty(shape, np.int16),
            np.empty(shape, np.float32), np.empty(shape, lane_proto.dtype))


@arithmetic
def tile_accumulate_arrays(tile_rows, lanes, lane_proto):
    """A task's arrays of :func:`mmaemu.arith.tile.tile_accumulate` besides the operands: (``work``, ``sums`` =
    (result, partial, slot), ``acc``), fp32 but for :func:`tile_work`."""
    shape = (tile_rows, lanes)
    sums = np.empty(shape, np.float32), np.empty(shape, np.float32), np.empty(shape, np.float32)
    return tile_work(tile_rows, lanes, lane_proto), sums, np.empty(shape, np.float32)


@arithmetic
def accumulate_panel_rows(m_lo, m_hi, a_codes, fmt_a, b_val, b_exp, n0, schedule, params, tile_rows, lane_proto,
                          out, a_flags, nonfinite_mask, nonfinite_pattern):
    """The fast path: out[m, n0:n0+lanes] = fp32 accumulators of rows m_lo .. m_hi-1 of A and of one panel of B,
    bit-identical to :func:`accumulate_gemm_reference` (finite codes; semantics.md (c), (d)).

    ``a_codes`` [M, K]: uint8 FP8 codes; ``fmt_a``: A's :data:`mmaemu.arith.tile.TILE_FORMATS` entry;
    ``b_val``/``b_exp`` [K, lanes]: the panel of B that starts at row ``n0`` of B, decoded by :func:`decode_panel`.
    Rows are taken ``tile_rows`` at a time from m_lo (m_lo is a multiple of tile_rows). ``lane_proto``: an empty
    array whose dtype (int32 or int64) is the lane integer type of the block sums
    (mmaemu.arith.tile.lane_bits_needed). The work arrays are the task's own. The tasks of the first panel
    (``n0 == 0``) also set ``a_flags[m]``: row m of A holds a NaN or Inf code (``code & nonfinite_mask ==
    nonfinite_pattern``), scanned right after the rows are decoded, while they are in the cache.
    """
    K = a_codes.shape[1]
    N = out.shape[1]
    lanes = b_val.shape[1]
    a_val, a_exp = decoded_rows_arrays(tile_rows, K)
    work, sums, acc = tile_accumulate_arrays(tile_rows, lanes, lane_proto)
    for m0 in range(m_lo, m_hi, tile_rows):
        rows = min(tile_rows, m_hi - m0)
        decode_rows(a_codes, m0, rows, fmt_a, a_val, a_exp)
        if n0 == 0:
            for r in range(rows):
                hit = 0
                for k in range(K):
                    hit |= (a_codes[m0 + r, k] & nonfinite_mask) == nonfinite_pattern
                a_flags[m0 + r] = hit != 0
        tile_accumulate(a_val, a_exp, b_val, b_exp, rows, K, schedule, params, work, sums, acc)
        for r in range(rows):
            for j in range(min(lanes, N - n0)):
                out[m0 + r, n0 + j] = acc[r, j]


# Calls of at most FEW_ROWS rows of A read a prepared B's panel values as bfloat16 (PreparedB.val16, 2 bytes a code
# instead of 4; :func:`mmaemu.arith.tile.panel_value`): such a call reads each decoded element once or a few
# times, so its time is that of B's memory traffic, not of its products (docs/performance.md: with 5-byte panels
# M = 1, 2 and 4 of (M, 5760, 1920) took the same time on 2 threads). Past a few rows the products dominate and the
# fp32 panels, one instruction less per product, are faster.
FEW_ROWS = 4


@arithmetic
def accumulate_prepared_panels(p_lo, p_hi, m_lo, m_hi, a_codes, fmt_a, b_val, b_exp, schedule, params, tile_rows,
                               lane_proto, out, a_flags, nonfinite_mask, nonfinite_pattern):
    """:func:`accumulate_panel_rows` for panels p_lo .. p_hi-1 of a prepared B (``b_val``/``b_exp`` [panels, K,
    lanes], :func:`mmaemu.cpu.engine.prepare_b`; ``b_val`` float32 or its bfloat16 bits, :data:`FEW_ROWS`): one
    compiled call where a task spans several panels (few rows of A: a call per panel cost more in dispatch than
    its products)."""
    lanes = b_val.shape[2]
    for p in range(p_lo, p_hi):
        accumulate_panel_rows(m_lo, m_hi, a_codes, fmt_a, b_val[p], b_exp[p], p * lanes, schedule, params, tile_rows,
                              lane_proto, out, a_flags, nonfinite_mask, nonfinite_pattern)


@arithmetic
def nonfinite_rows(lo, hi, codes, mask, pattern, flags):
    """flags[r] = some code of row r is NaN or Inf, i.e. ``code & mask == pattern`` (nonfinite.NONFINITE_PATTERN),
    for rows lo .. hi-1."""
    K = codes.shape[1]
    for r in range(lo, hi):
        hit = 0
        for k in range(K):
            hit |= (codes[r, k] & mask) == pattern
        flags[r] = hit != 0


@arithmetic
def override_nonfinite(lo, hi, a_codes, a_flags, a_table, b_codes, b_flags, b_table, out_bits):
    """Apply the NaN/Inf rule (c.4) to every output of rows lo .. hi-1 whose row of A or row of B holds a
    non-finite code.

    ``a_flags``/``b_flags``: per row, True if it holds a non-finite code. ``out_bits``: int32 view of the fp32
    accumulator [M, N].
    """
    N = out_bits.shape[1]
    for m in range(lo, hi):
        for n in range(N):
            if a_flags[m] or b_flags[n]:
                bits = nonfinite_accumulator(a_codes[m], b_codes[n], a_table, b_table)
                if bits != FINITE:
                    out_bits[m, n] = bits


@arithmetic
def epilogue_gemm(lo, hi, acc, alpha, out_code, scale_result, has_scale_result, out_bits):
    """out_bits[i] = output bits of acc[i] (semantics.md (e)) for i in lo .. hi-1; acc and out_bits are flat."""
    epilogue_span(acc, out_bits, lo, hi, alpha, out_code, scale_result, has_scale_result)


"""The chunked kernels (:mod:`mmaemu.model.chunked`: DeepGEMM's and cuBLASLt's block-wise GEMMs) on the offset
engine (:mod:`.offset_kernel`, :mod:`.offset_engine`).

Why the offset method computes them: a chunk's partial is one chain from +0 over the chunk's k range
(:func:`mmaemu.arith.scaled.chunk_partial`, ``chain_over_tiles(..., first=kb, stride=1, count=1, tile=chunk,
padded=0)``), which is the chain :func:`.offset_kernel.tile_chain` computes for the same arguments: the chain of a
slow-accumulation schedule whose k-tiles are the chunks (:func:`mmaemu.cpu.chunked.chunk_schedule`), which the
offset engine computes wherever :func:`mmaemu.cpu.features.offset_call_decline` accepts the preset, that schedule
and the formats (the chunk a multiple of nfma, so that whole blocks fill it). The chain's fp32 value is the offset
engine's :func:`~mmaemu.arith.offset.offset_chain_value`, entered from +0 as the split-K skeleton enters it
(:func:`~mmaemu.arith.offset.add_chain_values`). What differs from the tensor-wise kernel is after each chain: the
tile's 4 x 64 partials enter the tile's fp32 accumulators at once by :func:`mmaemu.arith.scaled.combine_chunk` with
the chunk's scales (the one source of the combine), in the tile's own arrays, so nothing of [M, N] is written per
chunk. The kernel entries are their own (:func:`chunked_panel_rows` and the two tasks); the packing of A and B, the
block step and the tasks' layout are the tensor-wise engine's (a kept weight's :class:`.offset_engine.PreparedB`
serves both).

Non-finite codes: the offset kernel computes the finite codes' products (a NaN or Inf code packs as an absent
term); the caller overwrites the outputs of rows of A and B that hold one (:func:`accumulate_chunked_offset`).

A kept call of few rows (a block-wise layer's decoding step) runs on the row tiles of :mod:`.offset_rows` instead:
:func:`chunked_row` is :func:`.offset_rows.row_chain` per chunk and the same combine, and :func:`token_rows_call`
is the whole call in one compiled call: DeepGEMM's per-token cast of the activations
(:func:`mmaemu.cpu.cast.token_strips_fp8`), the comparison of B's codes with the kept copy and B's NaN rows, the
chunks, E4M3's NaN rule and the output's bits (:class:`mmaemu.cpu.chunked.ChunkedRows` decides where it runs).
"""

from __future__ import annotations

import numpy as np

from ..base._jit import arithmetic
from ..arith.offset import offset_chain_value
from ..arith.params import Schedule
from ..arith.scaled import chunked_output_bits, combine_chunk
from ..arith.schedule import clear_tile
from . import threads
from .cast import token_strips_fp8
from .offset_engine import _constants, _run, code_decode, offset_tasks, pack_a, prepare_b
from .offset_kernel import MASKS, PANEL, ROWS, Operand, block_vectors, pack_panel, padded_k, panel_of, tile_chain
from .offset_rows import CALL_OUT_CODE, CALL_WORDS, call_parts, kept_call_flags, packed_rows, row_chain, row_work


@arithmetic
def chain_partial(chain, frac_out):
    """A chunk's fp32 partial of its chain's deferred accumulator ``chain`` (:func:`mmaemu.arith.offset.
    offset_chain_value`), entered from +0 as the split-K skeleton enters a chain (:func:`mmaemu.arith.offset.
    add_chain_values`)."""
    return np.float32(np.float32(0.0) + offset_chain_value(chain, frac_out))


@arithmetic
def chunked_panel_rows(m_lo, m_hi, a, b, n0, K, chunk, rule, scales_a, scales_b, schedule, constants, masks, out):
    """out[m, n0:n0+PANEL] = the chunked accumulators of rows m_lo .. m_hi-1 of A and one packed panel of B
    (finite codes), bit-identical to :func:`mmaemu.cpu.chunked.accumulate_chunked_reference`: per tile of ROWS
    rows, for each chunk kb its chain from +0 (:func:`.offset_kernel.tile_chain` over k-tile kb of ``schedule``,
    :func:`mmaemu.cpu.chunked.chunk_schedule`), then each output's chain value entered into the tile's accumulator by
    :func:`mmaemu.arith.scaled.combine_chunk` (``rule``; ``scales_a`` [M, chunks], ``scales_b`` [N, chunks]).
    ``a``, ``b``, ``constants``, ``masks``: as :func:`.offset_kernel.offset_panel_rows` takes them."""
    v = block_vectors(constants, masks)
    shape = (ROWS, PANEL)
    work = (np.empty(shape, np.uint32), np.empty(shape, np.float32), np.empty(shape, np.uint32),
            np.empty(shape, np.uint32))
    c_val = np.empty(shape, np.float32)
    final = np.empty(shape, np.float32)
    N = out.shape[1]
    groups = b.low.shape[0]
    width = min(PANEL, N - n0)
    frac_out = constants.frac_out
    for r0 in range(m_lo, m_hi, ROWS):
        rows = min(ROWS, m_hi - r0)
        clear_tile(final)
        for kb in range((K + chunk - 1) // chunk):
            tile_chain(a, (r0 // ROWS) * groups, b, K, kb, 1, 1, schedule, constants, v, c_val, work)
            for r in range(rows):
                scale_a = scales_a[r0 + r, kb]
                for j in range(width):
                    final[r, j] = combine_chunk(rule, final[r, j], chain_partial(c_val[r, j], frac_out), scale_a,
                                                scales_b[n0 + j, kb])
        for r in range(rows):
            for j in range(width):
                out[r0 + r, n0 + j] = final[r, j]


@arithmetic
def chunked_prepared_task(p_lo, p_hi, m_lo, m_hi, a, prepared, K, chunk, rule, scales_a, scales_b, schedule,
                          constants, masks, out):
    """One task on a prepared B: panels p_lo ... p_hi - 1 against rows m_lo ... m_hi - 1."""
    for p in range(p_lo, p_hi):
        chunked_panel_rows(m_lo, m_hi, a, panel_of(prepared, p), p * PANEL, K, chunk, rule, scales_a, scales_b,
                           schedule, constants, masks, out)


@arithmetic
def task_panel(kp):
    """A task's own panel of B (:class:`.offset_kernel.Operand` of one panel, K padded to ``kp``) and the scratch
    of :func:`.offset_kernel.pack_panel` (uint32 [kp / 4, PANEL])."""
    words = (kp // 4, PANEL)
    val, exp = np.empty((kp, PANEL), np.float32), np.empty((kp, PANEL), np.int8)
    return Operand(val, exp, np.empty(words, np.uint32), np.empty(words, np.uint32)), np.empty(words, np.uint32)


@arithmetic
def chunked_codes_task(p_lo, p_hi, m_lo, m_hi, a, codes, decode, K, chunk, rule, scales_a, scales_b, schedule,
                       constants, masks, out):
    """One task on B's codes: each of panels p_lo ... p_hi - 1 packed into the task's own panel
    (:func:`.offset_kernel.pack_panel`), then computed against rows m_lo ... m_hi - 1."""
    panel, scratch = task_panel(padded_k(K))
    for p in range(p_lo, p_hi):
        pack_panel(codes, p * PANEL, decode, panel, scratch)
        chunked_panel_rows(m_lo, m_hi, a, panel, p * PANEL, K, chunk, rule, scales_a, scales_b, schedule,
                           constants, masks, out)


def accumulate_chunked_offset(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel, preset, schedule, final,
                              prepared=None, masks=MASKS):
    """``final`` [M, N] (float32, C-contiguous) = the chunked accumulators of A [M, K] times B [N, K]^T (uint8
    codes, C-contiguous) by ``kernel`` (its chunk and combine rule) for the finite codes; the caller applies the
    rule of non-finite codes (:func:`mmaemu.cpu.chunked.accumulate_chunked_codes`). ``schedule``: the chunks'
    (:func:`mmaemu.cpu.chunked.chunk_schedule`); the call must satisfy
    :func:`mmaemu.cpu.features.offset_call_decline` for it and the CPU
    :func:`mmaemu.cpu.features.offset_engine_decline`. ``prepared``: B's offset panels
    (:func:`.offset_engine.prepare_b` of these codes, the caller's guarantee), or None: where one range of rows
    takes all of A each task packs its own panels, otherwise B is prepared first (as
    :func:`.offset_engine.accumulate_offset`). ``masks``: as :func:`.offset_engine.accumulate_prepared` takes
    them (tests give altered ones)."""
    M, K = a_codes.shape
    N = b_codes.shape[0]
    panels = max(1, -(-N // PANEL))
    tasks = offset_tasks(M, panels, K, threads.num_threads())
    if prepared is None and any(m_hi - m_lo != M for _, _, m_lo, m_hi in tasks):
        prepared = prepare_b(b_codes, fmt_b)
    constants = _constants(preset, fmt_a, fmt_b, None)
    schedule = Schedule(*(int(v) for v in schedule))
    chunk_args = (K, kernel.chunk, kernel.combine, scales_a, scales_b, schedule, constants, masks, final)
    a_packed = pack_a(a_codes, fmt_a)
    if prepared is not None:
        _run(chunked_prepared_task, tasks, K, a_packed, prepared.operand, *chunk_args)
    else:
        _run(chunked_codes_task, tasks, K, a_packed, np.ascontiguousarray(b_codes, dtype=np.uint8),
             code_decode(fmt_b), *chunk_args)


# The chunked row tiles: a kept block-wise call of few rows (a decoding step) as one compiled call
# (:func:`chunked_rows_call`), on the row tiles of :mod:`.offset_rows` (the same row chain, one per chunk).


@arithmetic
def chunked_row(a, row0, r, b, K, n0, width, chunk, rule, scales_a, scales_b, scale_rows, schedule, constants, v,
                work, c_val, final):
    """``final[0, j]`` = the chunked accumulator of row r of the tile (A's packed words from ``a``'s row ``row0``)
    and column n0 + j of the panel ``b`` (finite codes; j < ``width``), bit-identical to
    :func:`mmaemu.cpu.chunked.accumulate_chunked_reference`: for each chunk kb its chain from +0 on the row tile
    (:func:`mmaemu.cpu.offset_rows.row_chain` over k-tile kb of ``schedule``, :func:`mmaemu.cpu.chunked.
    chunk_schedule`), then :func:`mmaemu.arith.scaled.combine_chunk` (``rule``) with the row's scale ``scales_a[kb]``
    and B's ``scales_b[(n0 + j) // scale_rows, kb]`` (one scale per ``scale_rows`` rows of B: DeepGEMM's 128 x 128
    blocks, or 1)."""
    frac_out = constants.frac_out
    for j in range(PANEL):
        final[0, j] = np.float32(0.0)
    for kb in range((K + chunk - 1) // chunk):
        row_chain(a, row0, r, b, K, kb, 1, 1, schedule, constants, v, c_val, work)
        scale_a = scales_a[kb]
        for j in range(width):
            final[0, j] = combine_chunk(rule, final[0, j], chain_partial(c_val[0, j], frac_out), scale_a,
                                        scales_b[(n0 + j) // scale_rows, kb])


@arithmetic
def chunked_row_accumulators(a_codes, a_tables, prepared, K, chunk, rule, scales_a, scales_b, scale_rows, schedule,
                             constants, masks, acc):
    """``acc`` [M, N] = the chunked accumulators of A's codes [M, K] times the prepared B (finite codes; the offset
    engine's panels, :class:`.offset_kernel.Operand` of [panels, ...]) row tile by row tile (:func:`chunked_row`);
    ``scales_a`` [M, chunks]."""
    M = a_codes.shape[0]
    N = acc.shape[1]
    groups = prepared.low.shape[1]
    a = packed_rows(a_codes, a_tables, groups)
    v = block_vectors(constants, masks)
    work = row_work()
    c_val = np.empty((1, PANEL), np.float32)
    final = np.empty((1, PANEL), np.float32)
    for p in range(prepared.val.shape[0]):
        panel = panel_of(prepared, p)
        n0 = p * PANEL
        width = min(PANEL, N - n0)
        for m in range(M):
            chunked_row(a, (m // ROWS) * groups, m % ROWS, panel, K, n0, width, chunk, rule, scales_a[m], scales_b,
                        scale_rows, schedule, constants, v, work, c_val, final)
            for j in range(width):
                acc[m, n0 + j] = final[0, j]


# Where the chunked call's own words start in its constants (after :func:`mmaemu.cpu.offset_rows.call_words`' own).
CALL_CHUNK = CALL_WORDS
CALL_RULE = CALL_WORDS + 1
CALL_SCALE_ROWS = CALL_WORDS + 2


@arithmetic
def chunked_rows_call(words, kept_codes, b_codes, b_val, b_exp, b_low, b_sign, a_codes, scales_a, a_values, a_exps,
                      a_lows, a_signs, scales_b, acc, out_bits):
    """A whole kept chunked call on row tiles: False (nothing computed) unless ``b_codes`` are byte-identical to
    ``kept_codes``, the codes that the packed panels (``b_val`` ... ``b_sign``: the offset engine's
    :class:`~mmaemu.cpu.offset_engine.PreparedB`) were packed from; else the accumulators of A's codes [M, K] with
    ``scales_a`` [M, chunks] and B's ``scales_b`` (:func:`chunked_row_accumulators`; ``a_values`` ... ``a_signs``: A's
    packing tables) into ``acc``, NaN for the rows of A or B holding a NaN code (E4M3 x E4M3's rule, as
    :func:`mmaemu.cpu.chunked.nan_rows_and_columns`), each output's bits by :func:`mmaemu.arith.scaled.
    chunked_output_bits` (the kernel's output mode, no addend) into ``out_bits``, and True. ``words``:
    :func:`mmaemu.cpu.offset_rows.call_words` with the chunk, the combine rule and B's rows per scale after it."""
    c = words
    constants, schedule, masks = call_parts(words)
    M = a_codes.shape[0]
    N = b_codes.shape[0]
    same, a_flags, b_flags = kept_call_flags(words, kept_codes, b_codes, a_codes)
    if not same:
        return False
    chunked_row_accumulators(a_codes, (a_values, a_exps, a_lows, a_signs), Operand(b_val, b_exp, b_low, b_sign),
                             a_codes.shape[1], c[CALL_CHUNK], c[CALL_RULE], scales_a, scales_b, c[CALL_SCALE_ROWS],
                             schedule, constants, masks, acc)
    mode = c[CALL_OUT_CODE]
    for m in range(M):
        for n in range(N):
            if a_flags[m] or b_flags[n]:
                acc[m, n] = np.float32(np.nan)
            out_bits[m, n] = chunked_output_bits(mode, acc[m, n], 0, 0)
    return True


@arithmetic
def token_rows_call(words, cast, kept_codes, b_codes, b_val, b_exp, b_low, b_sign, x, a_values, a_exps, a_lows,
                    a_signs, scales_b, out_bits):
    """:func:`chunked_rows_call` of the activations ``x`` [M, K] (float32) cast first in the same compiled call by
    DeepGEMM's per-token cast (:func:`mmaemu.cpu.cast.token_strips_fp8`, one scale per chunk of each row; ``cast``
    = (floor, inverse_max), float32): a block-wise layer's decoding step."""
    M, K = x.shape
    chunk = words[CALL_CHUNK]
    a_codes = np.empty((M, K), np.uint8)
    scales_a = np.empty((M, (K + chunk - 1) // chunk), np.float32)
    token_strips_fp8(x, chunk, cast[0], cast[1], a_codes, scales_a)
    acc = np.empty((M, b_codes.shape[0]), np.float32)
    return chunked_rows_call(words, kept_codes, b_codes, b_val, b_exp, b_low, b_sign, a_codes, scales_a, a_values,
                             a_exps, a_lows, a_signs, scales_b, acc, out_bits)

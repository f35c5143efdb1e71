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
"""

from __future__ import annotations

import numpy as np

from ..base._jit import arithmetic
from ..arith.offset import offset_chain_value
from ..arith.params import Schedule
from ..arith.scaled import combine_chunk
from ..arith.schedule import clear_tile
from . import threads
from .offset_engine import _constants, _run, code_decode, offset_tasks, pack_a, prepare_b
from .offset_kernel import MASKS, PANEL, ROWS, Operand, block_vectors, pack_panel, padded_k, panel_of, tile_chain


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
                    partial = np.float32(np.float32(0.0) + offset_chain_value(c_val[r, j], frac_out))
                    final[r, j] = combine_chunk(rule, final[r, j], partial, scale_a, scales_b[n0 + j, kb])
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

"""The CPU engine of the chunked reference kernels (:mod:`mmaemu.model.chunked`): block-wise scaled GEMMs (DeepGEMM's
and cuBLASLt's; the kernel record's combine rule and output mode are the only difference).

* fast path, E4M3 x E4M3: :func:`accumulate_chunked_panel_rows`, the tiled fast path
  of :mod:`mmaemu.cpu.engine` (one decoded panel of B, rows of A a tile at a time) with the chunk loop inside: each
  chunk's tile of partials (:func:`mmaemu.arith.tile.tile_accumulate` over the chunk's k range, one chain from +0)
  enters the tile's accumulators by :func:`mmaemu.arith.scaled.combine_chunk` at once. E4M3 has no Inf, so a NaN
  code makes its chunk NaN and with it the output (the FMA propagates NaN): rows of A or B holding one give NaN;
* fast path, other format pairs: for each chunk, the chunk's partials of the whole GEMM
  (:func:`mmaemu.cpu.engine.accumulate_codes` on the chunk's k range, the NaN/Inf rule on the chunk's codes), then
  :func:`mmaemu.arith.scaled.combine_chunk_rows` enters them into the accumulators;
* the offset engine (:mod:`mmaemu.cpu.offset_chunked`), where :func:`chunked_engine` takes it (the offset method
  fits the chunk's chain: :func:`mmaemu.cpu.features.offset_call_decline` for :func:`chunk_schedule`, every FP8
  pair with the shipped kernels): each chunk's chain on the offset block step and the combine per tile right after
  it; then the outputs of rows holding a NaN or Inf code are those of E4M3's rule above (E4M3 x E4M3) or of the
  reference (:func:`reference_rows_and_columns`, the other pairs);
* a kept call of at most ``mmaemu.cpu.fused.ROW_KERNEL_ROWS`` rows with 128 x 128 block scales of B (a block-wise
  layer's decoding step, :func:`chunked_rows`): the offset method's row tiles, the activations' cast included, as
  one compiled call (:class:`ChunkedRows`);
* ``reference=True``: every output walks its chunks alone with
  :func:`mmaemu.arith.scaled.accumulate_chunked_one`, the reference the fast path is tested against.

All give the same bits. Extra memory of the fast paths: that of the tensor-wise fast path (the fused one), or one
[M, N] fp32 array of partials (the per-chunk one).
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import numpy as np

from .. import formats
from ..context import context_of
from ..base._jit import arithmetic
from ..arith.params import Schedule
from ..arith.scaled import accumulate_chunked_one, chunked_output_bits, combine_chunk, combine_chunk_rows
from ..arith.tile import TILE_FORMATS, lane_bits_needed, tile_accumulate, tile_decode
from . import threads
from .engine import (EPILOGUE_WORK, REFERENCE_PRODUCT_WORK, _check_prepared, _chosen_engine,
                     accumulate_codes, decode_operand, fast_path_tasks, nonfinite_flags, panel_source, tile_shape)
from .gemm import FEW_ROWS, TILE_M, TILE_N, output_tile, tile_accumulate_arrays


@arithmetic
def accumulate_chunked_reference(lo, hi, sa, ea, sb, eb, a_codes, b_codes, a_table, b_table, scales_a, scales_b,
                                 chunk, rule, params, out):
    """out[m, n] = accumulate_chunked_one(row m of A, row n of B) for the outputs of jobs lo .. hi-1 (a job: a
    tile of TILE_M x TILE_N outputs, :func:`mmaemu.cpu.gemm.output_tile`)."""
    M, K = sa.shape
    N = sb.shape[0]
    for job in range(lo, hi):
        m0, m1, n0, n1 = output_tile(job, M, N)
        for m in range(m0, m1):
            for n in range(n0, n1):
                out[m, n] = accumulate_chunked_one(sa[m], ea[m], sb[n], eb[n], a_codes[m], b_codes[n], a_table,
                                                   b_table, K, scales_a[m], scales_b[n], chunk, rule, params)


@arithmetic
def accumulate_chunked_panel_rows(m_lo, m_hi, a_codes, fmt_a, b_val, b_exp, n0, chunk, rule, scales_a, scales_b,
                                  params, tile_rows, lane_proto, final):
    """final[m, n0:n0+lanes] = chunked accumulators of rows m_lo .. m_hi-1 of A and one decoded panel of B (finite
    codes), bit-identical to :func:`accumulate_chunked_reference`.

    Arguments as :func:`mmaemu.cpu.gemm.accumulate_panel_rows`; ``scales_a`` [M, chunks], ``scales_b`` [N, chunks].
    Each chunk of a tile of rows is decoded into [tile_rows, chunk] buffers and accumulated over its own k range
    with an unsplit fast schedule (one chain from +0), then combined.
    """
    K = a_codes.shape[1]
    N = final.shape[1]
    lanes = b_val.shape[1]
    a_val = np.zeros((tile_rows, chunk), np.float32)
    a_exp = np.zeros((tile_rows, chunk), np.int8)
    work, sums, acc = tile_accumulate_arrays(tile_rows, lanes, lane_proto)
    tile_final = np.empty((tile_rows, lanes), np.float32)
    width_n = min(lanes, N - n0)
    for m0 in range(m_lo, m_hi, tile_rows):
        rows = min(tile_rows, m_hi - m0)
        for r in range(rows):
            for j in range(lanes):
                tile_final[r, j] = np.float32(0.0)
        for kb in range((K + chunk - 1) // chunk):
            k0 = kb * chunk
            width = min(chunk, K - k0)
            for r in range(rows):
                for k in range(width):
                    a_val[r, k], a_exp[r, k] = tile_decode(a_codes[m0 + r, k0 + k], fmt_a)
            tile_accumulate(a_val, a_exp, b_val[k0:k0 + width], b_exp[k0:k0 + width], rows, width,
                            Schedule(width, 1, 0, 0, 0, 0), params, work, sums, acc)
            for r in range(rows):
                sa = scales_a[m0 + r, kb]
                for j in range(width_n):
                    tile_final[r, j] = combine_chunk(rule, tile_final[r, j], acc[r, j], sa, scales_b[n0 + j, kb])
        for r in range(rows):
            for j in range(width_n):
                final[m0 + r, n0 + j] = tile_final[r, j]


@arithmetic
def nan_rows_and_columns(lo, hi, a_flags, b_flags, final):
    """final[m, n] = NaN where row m of A or row n of B holds a NaN code (rows lo .. hi-1)."""
    N = final.shape[1]
    for m in range(lo, hi):
        for n in range(N):
            if a_flags[m] or b_flags[n]:
                final[m, n] = np.float32(np.nan)


@arithmetic
def reference_rows_and_columns(lo, hi, a_flags, b_flags, sa, ea, sb, eb, a_codes, b_codes, a_table, b_table,
                               scales_a, scales_b, chunk, rule, params, final):
    """final[m, n] = accumulate_chunked_one(row m of A, row n of B), the reference, where row m of A or row n of B
    holds a NaN or Inf code (rows lo .. hi-1): the rule of non-finite codes after the offset engine's finite
    products (:func:`accumulate_chunked_codes`)."""
    K = sa.shape[1]
    N = final.shape[1]
    for m in range(lo, hi):
        for n in range(N):
            if a_flags[m] or b_flags[n]:
                final[m, n] = accumulate_chunked_one(sa[m], ea[m], sb[n], eb[n], a_codes[m], b_codes[n], a_table,
                                                     b_table, K, scales_a[m], scales_b[n], chunk, rule, params)


@arithmetic
def accumulate_chunked_prepared_panels(p_lo, p_hi, m_lo, m_hi, a_codes, fmt_a, b_val, b_exp, chunk, rule, scales_a,
                                       scales_b, params, tile_rows, lane_proto, final):
    """:func:`accumulate_chunked_panel_rows` for panels p_lo .. p_hi-1 of a prepared B (``b_val``/``b_exp``
    [panels, K, lanes], :func:`mmaemu.cpu.engine.prepare_b`), one compiled call for a range of panels."""
    lanes = b_val.shape[2]
    for p in range(p_lo, p_hi):
        accumulate_chunked_panel_rows(m_lo, m_hi, a_codes, fmt_a, b_val[p], b_exp[p], p * lanes, chunk, rule,
                                      scales_a, scales_b, params, tile_rows, lane_proto, final)


def accumulate_chunked_fast(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel, preset, params, final,
                            prepared=None):
    """The fused fast path of E4M3 x E4M3 (module docstring) into ``final``. With ``prepared`` (B's panels,
    :func:`mmaemu.cpu.engine.prepare_b`) and rows of A that make one tile range: the panels in ranges, one
    compiled call per range (:func:`accumulate_chunked_prepared_panels`; few rows read the bfloat16 panel values,
    :data:`mmaemu.cpu.gemm.FEW_ROWS`); otherwise one call of :func:`accumulate_chunked_panel_rows` per task of
    :func:`mmaemu.cpu.engine.fast_path_tasks`, B's panels decoded as the tasks need them or taken from
    ``prepared``."""
    (M, K), N = a_codes.shape, b_codes.shape[0]
    tile_rows, lanes = tile_shape(M, N, K)
    tasks = fast_path_tasks(M, N, K, threads.num_threads())
    lane_proto = np.empty(0, np.int32 if lane_bits_needed(preset) == 32 else np.int64)
    fmt = TILE_FORMATS[fmt_a]
    row_ranges = {(lo, hi) for _, lo, hi in tasks}
    if prepared is not None and len(row_ranges) == 1:
        (m_lo, m_hi), = row_ranges
        b_val = prepared.val16 if M <= FEW_ROWS else prepared.val
        ranges = threads.job_ranges(b_val.shape[0], (m_hi - m_lo) * lanes * K, threads.num_threads())

        def panel_range(p_lo, p_hi):
            accumulate_chunked_prepared_panels(p_lo, p_hi, m_lo, m_hi, a_codes, fmt, b_val, prepared.exp,
                                               kernel.chunk, kernel.combine, scales_a, scales_b, params, tile_rows,
                                               lane_proto, final)

        threads.run_tasks([lambda r=r: panel_range(*r) for r in ranges])
        b_flags = prepared.nonfinite
    else:
        acquire, release, b_flags = panel_source(prepared, b_codes, fmt_b, lanes,
                                                 uses=len(tasks) // -(-N // lanes))

        def task(panel, m_lo, m_hi):
            b_val, b_exp = acquire(panel)
            try:
                accumulate_chunked_panel_rows(m_lo, m_hi, a_codes, fmt, b_val, b_exp, panel * lanes, kernel.chunk,
                                              kernel.combine, scales_a, scales_b, params, tile_rows, lane_proto,
                                              final)
            finally:
                release(panel)

        threads.run_tasks(lambda t=t: task(*t) for t in tasks)
        if prepared is None:
            b_flags = nonfinite_flags(b_codes, fmt_b)
    a_flags = nonfinite_flags(a_codes, fmt_a)
    if a_flags.any() or b_flags.any():
        threads.parallel_for(nan_rows_and_columns, M, N, a_flags, b_flags, final)


@arithmetic
def output_rows(lo, hi, mode, final, d_bits, c_bits, out_bits):
    """out_bits[i] = chunked_output_bits(mode, final[i], d_bits[i], c_bits[i]) for i in lo .. hi-1 (flat
    arrays)."""
    for i in range(lo, hi):
        out_bits[i] = chunked_output_bits(mode, final[i], d_bits[i], c_bits[i])


# A B of fewer codes is decoded at each call: its decode costs less than finding and checking its kept panels (the
# bound of scaled_mm's kept weights, mmaemu.api).
KEPT_MIN_CODES = 1 << 14


def chunk_schedule(chunk: int) -> Schedule:
    """The schedule whose chains are the chunks of ``chunk`` k: one split, a chain restarted from +0 at every
    k-tile of width ``chunk``, stopped at K (a chunk's partial, :func:`mmaemu.arith.scaled.chunk_partial`): the
    schedule the engine choice asks :func:`mmaemu.cpu.features.offset_call_decline` about, and the one the offset
    engine walks each chunk's chain with (:mod:`mmaemu.cpu.offset_chunked`)."""
    return Schedule(chunk, 1, 0, 1, 0, 0)


def chunked_engine(kernel, fmt_a: str, fmt_b: str, shape, context=None) -> str:
    """The engine ("offset" or "tile") of a chunked call's fast path on an [M, N] result ``shape``:
    :func:`mmaemu.cpu.engine.cpu_engine_choice` for the kernel's preset, :func:`chunk_schedule` and the formats
    (``MMAEMU_CPU_ENGINE`` of ``context``; None: the context of this moment, read here), its warnings reported."""
    return _chosen_engine(kernel.tensor_core_preset, chunk_schedule(kernel.chunk), fmt_a, fmt_b, None, shape,
                          context)


def kept_panels(store, tensor, b_codes, fmt_a: str, fmt_b: str, kernel=None, rows=None, context=None):
    """B's prepared panels kept in ``store`` (:mod:`mmaemu.cpu.prepared`: the process-wide
    :data:`~mmaemu.cpu.prepared.WEIGHTS` or a layer's slot) for ``tensor``, B's rows [N, K] whose uint8 codes are
    ``b_codes``: the offset engine's (:func:`mmaemu.cpu.offset_engine.prepare_b`) where :func:`chunked_engine`
    takes it for ``kernel`` and a result of ``rows`` rows (``context``: as it takes it), else the tile engine's
    (:func:`mmaemu.cpu.engine.prepare_b`; also without ``kernel`` or ``rows``). None where no fast path would read
    them (a B of fewer than :data:`KEPT_MIN_CODES` codes, a tensor off the CPU, the tile engine with a format
    pair other than E4M3 x E4M3) or the store keeps none yet (it keeps a B the second time it sees it
    unchanged)."""
    if b_codes.size < KEPT_MIN_CODES or tensor.device.type != "cpu":
        return None
    from .engine import OFFSET, TILE

    offset = kernel is not None and rows is not None and chunked_engine(
        kernel, fmt_a, fmt_b, (rows, b_codes.shape[0]), context) == "offset"
    if not offset and (fmt_a != "e4m3" or fmt_b != "e4m3"):
        return None
    return store.prepared(OFFSET if offset else TILE, fmt_b, tensor, b_codes)


def _check_scales(scales, rows, chunks, name):
    scales = np.ascontiguousarray(scales, dtype=np.float32)
    if scales.shape != (rows, chunks):
        raise ValueError(f"{name} must have shape {(rows, chunks)} (one fp32 scale per row and chunk), got "
                         f"{scales.shape}")
    return scales


def accumulate_chunked_codes(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel, *, reference=False,
                             prepared_b=None, context=None):
    """fp32 accumulators [M, N] of A [M, K] times B [N, K]^T (uint8 FP8 codes) by a chunked kernel.

    ``scales_a`` [M, ceil(K / chunk)], ``scales_b`` [N, ceil(K / chunk)]: the fp32 scale of each row's chunk (a
    block scale of B is given once per row of B it covers). K must be positive. ``prepared_b``: B's panels of these
    codes (the caller's guarantee, as for :func:`mmaemu.cpu.engine.accumulate_codes`), which name the engine: the
    offset engine's (:func:`mmaemu.cpu.offset_engine.prepare_b`) or the tile engine's
    (:func:`mmaemu.cpu.engine.prepare_b`, read by its fused fast path, E4M3 x E4M3), or None: the engine is
    :func:`chunked_engine`'s. ``context``: the :class:`mmaemu.context.Context` whose ``MMAEMU_CPU_ENGINE`` picks
    the engine, and that of the other pairs' chunks on the tile engine (None: that of this moment, read once,
    here).
    """
    from ..arith.params import preset_params

    a_codes = np.ascontiguousarray(a_codes, dtype=np.uint8)
    b_codes = np.ascontiguousarray(b_codes, dtype=np.uint8)
    (M, K), N = a_codes.shape, b_codes.shape[0]
    preset = kernel.tensor_core_preset
    if kernel.chunk % preset.nfma:
        raise ValueError(f"kernel {kernel.name!r}: chunk {kernel.chunk} is not a multiple of nfma={preset.nfma}")
    chunks = -(-K // kernel.chunk)
    scales_a = _check_scales(scales_a, M, chunks, "scales_a")
    scales_b = _check_scales(scales_b, N, chunks, "scales_b")
    final = np.zeros((M, N), np.float32)
    if M == 0 or N == 0 or K == 0:
        return final
    params = preset_params(preset, fmt_a, fmt_b)
    if reference:
        sa, ea = decode_operand(a_codes, fmt_a)
        sb, eb = decode_operand(b_codes, fmt_b)
        jobs = -(-M // TILE_M) * -(-N // TILE_N)
        threads.parallel_for(accumulate_chunked_reference, jobs, REFERENCE_PRODUCT_WORK * TILE_M * TILE_N * K, sa,
                             ea, sb, eb, a_codes, b_codes, np.array(formats.values(fmt_a)),
                             np.array(formats.values(fmt_b)), scales_a, scales_b, kernel.chunk, kernel.combine,
                             params, final)
        return final
    if prepared_b is None:
        context = context_of(context)  # one reading for the engine and every chunk of a call outside a planned one
        engine = chunked_engine(kernel, fmt_a, fmt_b, (M, N), context)
    else:
        engine = prepared_b.engine
    if engine == "offset":
        accumulate_chunked_on_offset(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel, preset, params,
                                     final, prepared_b)
        return final
    if fmt_a == fmt_b == "e4m3":
        if prepared_b is not None:
            _check_prepared(prepared_b, b_codes, fmt_b)
        accumulate_chunked_fast(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel, preset, params, final,
                                prepared_b)
        return final
    if prepared_b is not None:
        _check_prepared(prepared_b, b_codes, fmt_b)  # a tile engine's B for a pair its fused path does not take
    context = context_of(context)
    for kb in range(chunks):
        k0, k1 = kb * kernel.chunk, min((kb + 1) * kernel.chunk, K)
        partial = accumulate_codes(a_codes[:, k0:k1], b_codes[:, k0:k1], fmt_a, fmt_b, preset, True,
                                   context=context)
        threads.parallel_for(combine_chunk_rows, M, max(1, N // 8), kernel.combine, final, partial, scales_a,
                             scales_b, kb)
    return final


def accumulate_chunked_on_offset(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel, preset, params, final,
                                 prepared=None):
    """The offset engine's chunked path (:func:`mmaemu.cpu.offset_chunked.accumulate_chunked_offset`) into
    ``final``, then the rule of non-finite codes: E4M3 x E4M3 by NaN rows and columns (E4M3 has no Inf: a NaN code
    makes its chunk and with it the output NaN), the other pairs by the reference for the outputs of rows holding
    a NaN or Inf code (:func:`reference_rows_and_columns`). ``prepared``: B's offset panels of these codes, or
    None."""
    from .offset_chunked import accumulate_chunked_offset

    if prepared is not None and (prepared.engine != "offset" or prepared.fmt != fmt_b
                                 or prepared.shape != b_codes.shape):
        raise ValueError(f"prepared_b was prepared by engine {prepared.engine!r} for a {prepared.fmt} B of shape "
                         f"{prepared.shape}, not for this {fmt_b} B of shape {b_codes.shape} (offset engine)")
    accumulate_chunked_offset(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel, preset,
                              chunk_schedule(kernel.chunk), final, prepared)
    # a kept B's row flags were found when its panels were (PreparedB.nonfinite): not read again from its codes
    b_flags = nonfinite_flags(b_codes, fmt_b) if prepared is None else prepared.nonfinite
    a_flags = nonfinite_flags(a_codes, fmt_a)
    if not (a_flags.any() or b_flags.any()):
        return
    M, K = a_codes.shape
    N = b_codes.shape[0]
    if fmt_a == fmt_b == "e4m3":
        threads.parallel_for(nan_rows_and_columns, M, N, a_flags, b_flags, final)
        return
    sa, ea = decode_operand(a_codes, fmt_a)
    sb, eb = decode_operand(b_codes, fmt_b)
    threads.parallel_for(reference_rows_and_columns, M, REFERENCE_PRODUCT_WORK * N * K, a_flags, b_flags, sa, ea,
                         sb, eb, a_codes, b_codes, np.array(formats.values(fmt_a)), np.array(formats.values(fmt_b)),
                         scales_a, scales_b, kernel.chunk, kernel.combine, params, final)


def _fp32_bits(values, shape, given: bool):
    """int32 bits of fp32 ``values`` broadcast to ``shape`` (flat), or zeros where the mode does not read them."""
    if not given:
        return np.zeros(int(np.prod(shape)), np.int32)
    values = np.broadcast_to(np.asarray(values, dtype=np.float32), shape)
    return np.ascontiguousarray(values).reshape(-1).view(np.int32)


def chunked_output(final, kernel, d=None, c=None):
    """The output of accumulators ``final`` [M, N] by ``kernel.output`` (a mode of :mod:`mmaemu.arith.scaled`): a
    uint16 array of bf16 patterns, or with OUTPUT_FP32_FLAG a uint32 array of fp32 patterns. OUTPUT_ADD_FLAG takes
    ``d``, added as ``RN(d + final)`` before the cast; OUTPUT_ACCUMULATE_FLAG takes ``c``, the existing output
    widened to fp32, added after it; each an fp32 array of final's shape or one that broadcasts to it (a bias
    [N])."""
    from ..arith.scaled import OUTPUT_ACCUMULATE_FLAG, OUTPUT_ADD_FLAG, OUTPUT_FP32_FLAG

    final = np.ascontiguousarray(final, dtype=np.float32)
    d_bits = _fp32_bits(d, final.shape, bool(kernel.output & OUTPUT_ADD_FLAG))
    c_bits = _fp32_bits(c, final.shape, bool(kernel.output & OUTPUT_ACCUMULATE_FLAG))
    out = np.empty(final.size, np.uint32 if kernel.output & OUTPUT_FP32_FLAG else np.uint16)
    threads.parallel_for(output_rows, final.size, EPILOGUE_WORK, kernel.output, final.reshape(-1), d_bits, c_bits,
                         out)
    return out


class ChunkedRows(NamedTuple):
    """A kept chunked call of few rows (a block-wise layer's decoding step, E4M3 x E4M3) on the offset method's row
    tiles as one compiled call (:func:`mmaemu.cpu.offset_chunked.token_rows_call`: the activations' per-token cast,
    the comparison of B's codes with the kept copy and B's NaN rows, the chunks' chains and combines, the NaN rule
    and the output's bits), made by :func:`chunked_rows` once per shape and context: the call's constants and A's
    packing tables."""

    words: np.ndarray  # mmaemu.cpu.offset_rows.call_words with the chunk, the combine rule and B's rows per scale
    cast: np.ndarray  # float32 (floor, inverse_max) of DeepGEMM's per-token cast
    a_tables: tuple  # the offset engine's packing tables of E4M3 (values, exponent bytes, lows, signs)
    kernel: object  # token_rows_call, or where the CPU rounds by MXCSR that call restoring it also when it raises

    def run(self, store, tensor, x, b_codes, scales_b):
        """The output's bits [M, N] (uint16 bf16 patterns: the kernel's output mode) of the float32 activations
        ``x`` [M, K] cast per token and B's codes ``b_codes`` [N, K] (uint8, C-contiguous: the rows of ``tensor``)
        with B's block scales ``scales_b`` [ceil(N / 128), chunks] (float32), on B's offset panels kept in
        ``store`` (a layer's :class:`mmaemu.cpu.prepared.WeightSlot`); None where B is not kept (yet)."""
        from .engine import OFFSET

        M, N = x.shape[0], b_codes.shape[0]
        out_bits = np.empty((M, N), np.uint16)
        kept = store.candidate(OFFSET, "e4m3", tensor)
        if kept is not None and self._call(kept.prepared, kept.codes, x, b_codes, scales_b, out_bits):
            return out_bits
        prepared = store.prepared(OFFSET, "e4m3", tensor, b_codes)
        if prepared is not None and self._call(prepared, b_codes.reshape(-1), x, b_codes, scales_b, out_bits):
            return out_bits
        return None

    def _call(self, prepared, kept_codes, x, b_codes, scales_b, out_bits) -> bool:
        if prepared.shape != b_codes.shape or prepared.fmt != "e4m3" or kept_codes.size != b_codes.size:
            return False
        values, exps, lows, signs = self.a_tables
        return bool(self.kernel(self.words, self.cast, kept_codes, b_codes, prepared.val, prepared.exp, prepared.low,
                                prepared.sign, x, values, exps, lows, signs, scales_b, out_bits))


#: B's rows per scale of DeepGEMM's recipe (1, 128, 128): one scale per 128 x 128 block of the weight.
DEEPGEMM_SCALE_ROWS = 128


def chunked_rows(kernel, M: int, N: int, K: int, n_threads: int, context) -> Optional[ChunkedRows]:
    """The row tiles' call of a kept chunked call of M rows on [N, K] E4M3 weights whose scales are 128 x 128
    blocks (:class:`ChunkedRows`), or None where it does not run. It runs where the tensor-wise kept call runs on
    row tiles (:func:`mmaemu.cpu.fused.row_tiles_fit`: the engine of :func:`chunked_engine` is the tile engine,
    M <= ROW_KERNEL_ROWS, the engine choice for :func:`chunk_schedule` without the shape rule is the offset
    engine, the CPU rounds by AVX-512's embedded rounding) and the tile engine's kept call would be one task
    (its panel ranges on ``n_threads`` threads, :func:`accumulate_chunked_fast`): the row tiles run on the calling
    thread. The kernel's output mode must take no addend (DeepGEMM's 1d2d kernel: bf16). ``context``: the call's
    :class:`mmaemu.context.Context`; the engine choice's warnings are reported."""
    from ..arith.offset import ADD_MAX, offset_params
    from ..arith.params import preset_params
    from ..arith.scaled import OUTPUT_ACCUMULATE_FLAG, OUTPUT_ADD_FLAG, OUTPUT_FP32_FLAG
    from .engine import NONFINITE_PATTERN, cpu_engine_choice
    from .features import CPU_ENGINE_ENV, ROUNDING_EMBEDDED, numba_target, offset_rounding
    from .fused import row_tiles_fit

    if kernel.output & (OUTPUT_ADD_FLAG | OUTPUT_ACCUMULATE_FLAG | OUTPUT_FP32_FLAG) or M < 1 or K < 1 or N < 1:
        return None
    preset, fmt = kernel.tensor_core_preset, "e4m3"
    schedule = chunk_schedule(kernel.chunk)
    rounding = offset_rounding(numba_target())
    if not row_tiles_fit("tile", M, "offset", rounding):
        return None
    engine = chunked_engine(kernel, fmt, fmt, (M, N), context)
    choice = cpu_engine_choice(preset, schedule, fmt, fmt, context.environment[CPU_ENGINE_ENV], None,
                               context=context)
    if not row_tiles_fit(engine, M, choice.engine, rounding):
        return None
    lanes = tile_shape(M, N, K)[1]
    if n_threads > 1 and len(threads.job_ranges(-(-N // lanes), M * lanes * K, n_threads)) > 1:
        return None
    from .offset_chunked import CALL_CHUNK, CALL_RULE, CALL_SCALE_ROWS, token_rows_call
    from .offset_engine import packing_tables
    from .offset_kernel import MASKS
    from .offset_rows import CALL_WORDS, call_words
    from .simd import call_restoring_mxcsr
    from ..base.gpu_torch_ops import reciprocal_of_number

    assert (CALL_CHUNK, CALL_RULE, CALL_SCALE_ROWS) == (CALL_WORDS, CALL_WORDS + 1, CALL_WORDS + 2)
    words = call_words(offset_params(preset_params(preset, fmt, fmt), fmt, fmt, ADD_MAX), schedule, MASKS,
                       NONFINITE_PATTERN[fmt], NONFINITE_PATTERN[fmt], K, kernel.output,
                       (kernel.chunk, kernel.combine, DEEPGEMM_SCALE_ROWS))
    cast = np.array([TOKEN_AMAX_FLOOR, reciprocal_of_number(E4M3_MAX)], np.float32)
    cast.setflags(write=False)
    call = token_rows_call
    if rounding != ROUNDING_EMBEDDED:
        call = functools.partial(call_restoring_mxcsr, token_rows_call)
    return ChunkedRows(words, cast, packing_tables(fmt), call)


#: DeepGEMM's per-token cast (``per_token_cast_to_fp8``, :mod:`mmaemu.deepgemm.utils`): ``amax.clamp(1e-4) / 448``,
#: the bound read as fp32, the division the CUDA kernel's multiplication by fp32(1 / 448).
TOKEN_AMAX_FLOOR = np.float32(1e-4)
E4M3_MAX = 448.0

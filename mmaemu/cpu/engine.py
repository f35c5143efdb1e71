"""NumPy-level entry points of the CPU backend: decode, schedule, cut the loops into tasks, run them on the CPU
backend's threads (:mod:`mmaemu.cpu.threads`)."""

from __future__ import annotations

import threading
from typing import NamedTuple, Tuple

import numpy as np

from .. import formats
from ..context import context_of
from ..warn import report
from ..arith.epilogue import OUT_CODES, scale_product
from ..arith.params import codes_gemm
from ..arith.rounding import BFLOAT16, FLOAT32, value_of_bits
from ..arith.rowwise import exact_values, rowwise_epilogue_rows
from ..arith.tile import TILE_ABSENT_EXP, TILE_FORMATS, lane_bits_needed, narrow_panel_values, tile_decode
from . import threads
from .features import (CPU_ENGINE_ENV, EngineChoice, choose_cpu_engine, numba_target, offset_call_decline,
                       offset_rounding, offset_shape_decline)
from .gemm import (FEW_ROWS, TILE_M, TILE_N, accumulate_gemm_reference, accumulate_panel_rows, accumulate_prepared_panels,
                   decode_panel, decode_panels, epilogue_gemm, override_nonfinite)
from .nonfinite import NONFINITE_PATTERN, nonfinite_flags
from .prepared import Engine
from .selftest import OffsetSelftest, process_verdict, run_offset_selftest

_OUT_VIEW = {"float32": np.uint32, "bfloat16": np.uint16, "float16": np.uint16,
             "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}


def decode_operand(codes: np.ndarray, fmt: str):
    """Significands (int8) and alignment exponents (int16) of a [rows, K] array of FP8 codes."""
    return formats.significands(fmt)[codes], formats.exponents(fmt)[codes]


def tile_tables(fmt: str):
    """(fp32 value, int8 exponent) of the 256 codes of an operand format in the tile layout (zero and non-finite
    codes: 0 and TILE_ABSENT_EXP), read-only and built once: the FP8 formats tabulate
    :func:`mmaemu.arith.tile.tile_decode` (the decode of the tile loops); the FP6/FP4 formats of the block-scaled
    instructions (codes taken modulo their width) come from :mod:`mmaemu.formats`."""
    if fmt not in _TILE_TABLES:
        if fmt in TILE_FORMATS:
            pairs = [tile_decode(np.uint8(code), TILE_FORMATS[fmt]) for code in range(256)]
            value = np.array([v for v, _ in pairs], np.float32)
            exp = np.array([e for _, e in pairs], np.int8)
        else:
            codes = np.arange(256) % (1 << formats.CODE_BITS[fmt])
            finite = ~formats.nonfinite_codes(fmt)[codes]
            value = np.where(finite, np.nan_to_num(formats.values(fmt)[codes]), 0.0).astype(np.float32)
            exp = np.where(value == 0, TILE_ABSENT_EXP, formats.exponents(fmt)[codes]).astype(np.int8)
        value.setflags(write=False)
        exp.setflags(write=False)
        _TILE_TABLES[fmt] = (value, exp)
    return _TILE_TABLES[fmt]


_TILE_TABLES = {}
# A tile is TILE_ROWS rows of A against one panel of up to MAX_LANES columns: a tile of 4 x 128 outputs keeps a
# block of B (nfma x 128 x 5 bytes) in the L1 cache while its 4 rows use it, and every lane loop runs whole
# AVX-512 vectors.
TILE_ROWS = 4
MAX_LANES = 128
# Costs in products of the fast path (task sizes of mmaemu.cpu.threads), measured here on one core: a product of
# the reference path costs about 25 (0.45 against 10 GMAC/s, docs/performance.md), the epilogue of one output
# about 20 since it is vectorised (1.2 ns for fp32, 2.2 ns for bf16 and fp8 outputs, against 0.100 ns a product of
# accumulate_codes, in one process on the 2-core Zen 4 on 7 Dec 2026; it was 256 for the scalar epilogue's 26 ns).
REFERENCE_PRODUCT_WORK = 25
EPILOGUE_WORK = 20
# Decoding one code of a panel costs about 2 ns (design note cpu-simd.md), some 20 products of the fast path.
PANEL_DECODE_WORK = 20


def panel_lanes(N: int) -> int:
    """Lanes of the fast path's panels of B: as wide as N needs, 16 .. MAX_LANES (a power of two)."""
    lanes = 16
    while lanes < MAX_LANES and lanes < N:
        lanes *= 2
    return lanes


def tile_shape(M: int, N: int, K: int):
    """``(tile_rows, lanes)`` of the fast path: panels as wide as N needs (16 .. 128 lanes), tiles of up to
    TILE_ROWS rows."""
    return min(TILE_ROWS, M), panel_lanes(N)




def nonfinite_table(fmt: str) -> np.ndarray:
    """uint8 [256]: 1 for the NaN and Inf codes of a format (:data:`NONFINITE_PATTERN`), else 0."""
    if fmt not in _NONFINITE_TABLES:
        mask, pattern = NONFINITE_PATTERN[fmt]
        table = ((np.arange(256) & mask) == pattern).astype(np.uint8)
        table.setflags(write=False)
        _NONFINITE_TABLES[fmt] = table
    return _NONFINITE_TABLES[fmt]


_NONFINITE_TABLES = {}


class DecodedPanels:
    """The panels of B in the tile layout (:func:`mmaemu.cpu.gemm.decode_panel`), each decoded by the first task
    that needs it and dropped after the last one (``uses`` tasks per panel): tasks are handed out panel by panel,
    so about one panel per thread is held at a time. ``flags[n]``: row n of B holds a NaN or Inf code, found by
    the decode (complete once every panel was acquired)."""

    def __init__(self, b_codes, fmt_b: str, lanes: int, uses: int):
        self._codes, self._tables, self._lanes = b_codes, tile_tables(fmt_b), lanes
        self._nonfinite = nonfinite_table(fmt_b)
        self.flags = np.zeros(b_codes.shape[0], np.bool_)
        panels = -(-b_codes.shape[0] // lanes)
        self._locks = [threading.Lock() for _ in range(panels)]
        self._left = [uses] * panels
        self._decoded = {}

    def acquire(self, panel: int):
        with self._locks[panel]:
            if panel not in self._decoded:
                K = self._codes.shape[1]
                val, exp = np.empty((K, self._lanes), np.float32), np.empty((K, self._lanes), np.int8)
                decode_panel(self._codes, panel * self._lanes, self._tables[0], self._tables[1], self._nonfinite, val,
                             exp, self.flags)
                self._decoded[panel] = val, exp
            return self._decoded[panel]

    def release(self, panel: int):
        with self._locks[panel]:
            self._left[panel] -= 1
            if not self._left[panel]:
                del self._decoded[panel]


def panel_source(prepared, b_codes, fmt_b: str, lanes: int, uses: int):
    """(acquire(panel) -> (val, exp), release(panel), flags) of B's panels in the tile layout: a kept B's
    (``prepared``, a :class:`PreparedB`; nothing to release, its flags complete), else :class:`DecodedPanels`
    decoding ``b_codes`` (``uses`` tasks per panel; its flags complete once every panel was acquired)."""
    if prepared is None:
        decoded = DecodedPanels(b_codes, fmt_b, lanes, uses=uses)
        return decoded.acquire, decoded.release, decoded.flags

    def acquire(panel):
        return prepared.val[panel], prepared.exp[panel]

    def release(panel):
        pass

    return acquire, release, prepared.nonfinite


class PreparedB(NamedTuple):
    """B [N, K] prepared once by an engine, for any number of products with it (:func:`prepare_b`; kept by
    :mod:`mmaemu.cpu.prepared`). For the tile engine: every panel in the tile layout, ``val`` float32 and ``exp``
    int8 [panels, K, lanes], ``nonfinite`` bool [N] (row n holds a NaN or Inf code) and ``val16``, ``val`` as
    bfloat16 bits (uint16) for calls of few rows of A (:data:`mmaemu.cpu.gemm.FEW_ROWS`). It depends only on B's
    codes, their format and the engine."""

    engine: str
    fmt: str
    shape: Tuple[int, int]
    val: np.ndarray
    exp: np.ndarray
    nonfinite: np.ndarray
    val16: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.val.nbytes + self.exp.nbytes + self.nonfinite.nbytes + self.val16.nbytes


#: The tile engine's name in prepared data and cache keys (another CPU engine prepares B its own way).
TILE_ENGINE = "tile"


def prepared_b_nbytes(N: int, K: int) -> int:
    """Bytes of the tile engine's :class:`PreparedB` of a [N, K] B (7 per code of its panels, 1 per row)."""
    lanes = panel_lanes(N)
    return -(-N // lanes) * lanes * K * 7 + N


def prepare_b(b_codes, fmt_b: str) -> PreparedB:
    """Decode every panel of B [N, K] (uint8 codes) for the tile engine, in parallel over the panels."""
    b_codes = np.ascontiguousarray(b_codes, dtype=np.uint8)
    N, K = b_codes.shape
    lanes = panel_lanes(N)
    panels = -(-N // lanes)
    val, exp = np.empty((panels, K, lanes), np.float32), np.empty((panels, K, lanes), np.int8)
    flags = np.zeros(N, np.bool_)
    value_table, exp_table = tile_tables(fmt_b)
    threads.parallel_for(decode_panels, panels, lanes * K * PANEL_DECODE_WORK, b_codes, value_table, exp_table,
                         nonfinite_table(fmt_b), val, exp, flags)
    return PreparedB(TILE_ENGINE, fmt_b, (N, K), val, exp, flags, narrow_panel_values(val))


#: The tile engine as :mod:`mmaemu.cpu.prepared` keeps its prepared B.
TILE = Engine(TILE_ENGINE, prepare_b, prepared_b_nbytes)


def _offset_prepare_b(b_codes, fmt_b: str):
    from .offset_engine import prepare_b as offset_prepare_b

    return offset_prepare_b(b_codes, fmt_b)


def _offset_nbytes(N: int, K: int) -> int:
    """Bytes of the offset engine's prepared B: 8 per code, in whole panels of 64 columns and passes of 16 k, and
    1 per row (its NaN/Inf flag)."""
    return max(1, -(-N // 64)) * 64 * max(16, -(-K // 16) * 16) * 8 + N


OFFSET = Engine("offset", _offset_prepare_b, _offset_nbytes)  # the offset engine (mmaemu.cpu.offset_engine)


def _check_prepared(prepared: PreparedB, b_codes, fmt_b: str) -> None:
    if prepared.engine != TILE_ENGINE or prepared.fmt != fmt_b or prepared.shape != b_codes.shape:
        raise ValueError(f"prepared_b was prepared by engine {prepared.engine!r} for a {prepared.fmt} B of shape "
                         f"{prepared.shape}, not for this {fmt_b} B of shape {b_codes.shape} (tile engine)")


def fast_path_tasks(M: int, N: int, K: int, n_threads: int):
    """The tasks of the fast path, ``(panel, m_lo, m_hi)``: every panel of B with each range of rows of A from
    :func:`mmaemu.cpu.threads.job_ranges` (a job: one tile of rows), panel by panel."""
    tile_rows, lanes = tile_shape(M, N, K)
    panels, row_tiles = -(-N // lanes), -(-M // tile_rows)
    row_ranges = threads.job_ranges(row_tiles, tile_rows * lanes * K, n_threads, repeats=panels)
    return [(p, lo * tile_rows, min(hi * tile_rows, M)) for p in range(panels) for lo, hi in row_ranges]


def accumulate_fast(a_codes, b_codes, fmt_a, fmt_b, preset, schedule, params, out, prepared=None):
    """Run the fast path (:func:`mmaemu.cpu.gemm.accumulate_panel_rows`) into ``out`` [M, N] (finite outputs),
    one call per task of :func:`fast_path_tasks`; B's panels from ``prepared`` (:func:`prepare_b`) when given,
    else decoded as the tasks need them. Returns ``(a_flags, b_flags)``: per row of A and of B, whether it holds
    a NaN or Inf code, found by the decode passes (no separate scan). A call of one task runs on the calling
    thread without the task machinery."""
    (M, K), N = a_codes.shape, b_codes.shape[0]
    tile_rows, lanes = tile_shape(M, N, K)
    tasks = fast_path_tasks(M, N, K, threads.num_threads())
    lane_proto = np.empty(0, np.int32 if lane_bits_needed(preset) == 32 else np.int64)
    fmt = TILE_FORMATS[fmt_a]
    mask, pattern = NONFINITE_PATTERN[fmt_a]
    a_flags = np.zeros(M, np.bool_)
    if prepared is None and len(tasks) == 1:
        value_table, exp_table = tile_tables(fmt_b)
        b_val, b_exp = np.empty((K, lanes), np.float32), np.empty((K, lanes), np.int8)
        b_flags = np.zeros(N, np.bool_)
        decode_panel(b_codes, 0, value_table, exp_table, nonfinite_table(fmt_b), b_val, b_exp, b_flags)
        accumulate_panel_rows(0, M, a_codes, fmt, b_val, b_exp, 0, schedule, params, tile_rows, lane_proto, out,
                              a_flags, mask, pattern)
        return a_flags, b_flags
    row_ranges = {(lo, hi) for _, lo, hi in tasks}
    if prepared is not None and len(row_ranges) == 1:
        # every task holds all rows: panels in ranges, one compiled call per range (threads.job_ranges' sizes)
        (m_lo, m_hi), = row_ranges
        panels = prepared.val.shape[0]
        ranges = threads.job_ranges(panels, (m_hi - m_lo) * lanes * K, threads.num_threads())
        b_val = prepared.val16 if M <= FEW_ROWS else prepared.val

        def panel_range(p_lo, p_hi):
            accumulate_prepared_panels(p_lo, p_hi, m_lo, m_hi, a_codes, fmt, b_val, prepared.exp, schedule,
                                       params, tile_rows, lane_proto, out, a_flags, mask, pattern)

        threads.run_tasks([lambda r=r: panel_range(*r) for r in ranges])
        return a_flags, prepared.nonfinite
    acquire, release, b_flags = panel_source(prepared, b_codes, fmt_b, lanes, uses=len(tasks) // -(-N // lanes))

    def task(panel, m_lo, m_hi):
        b_val, b_exp = acquire(panel)
        try:
            accumulate_panel_rows(m_lo, m_hi, a_codes, fmt, b_val, b_exp, panel * lanes, schedule, params,
                                  tile_rows, lane_proto, out, a_flags, mask, pattern)
        finally:
            release(panel)

    if len(tasks) == 1:
        task(*tasks[0])
    else:
        threads.run_tasks([lambda t=t: task(*t) for t in tasks], [(hi - lo) * lanes * K for _, lo, hi in tasks])
    return a_flags, b_flags


def cpu_engine_choice(preset, schedule, fmt_a: str, fmt_b: str, requested=None, shape=None, *,
                      context=None) -> EngineChoice:
    """The engine of the fast path for a call (:func:`mmaemu.cpu.features.choose_cpu_engine`), a pure function of
    its arguments and ``context`` (a :class:`mmaemu.context.Context`; it reads no environment): ``requested``
    (auto, offset, tile; None: ``MMAEMU_CPU_ENGINE`` of ``context``, which must then be given), the CPU Numba
    compiles for, whether the offset method computes the preset, schedule and formats
    (:func:`mmaemu.cpu.features.offset_call_decline`), for ``auto`` whether it is the faster engine for the
    result's ``shape`` (M, N) with the target's rounding (None: any shape), and on an AVX2 target the self-test
    verdict of ``context``'s source (:func:`selftest_of`; without a context, the process's)."""
    if requested is None:
        if context is None:
            raise TypeError("cpu_engine_choice: give the requested engine or the context whose MMAEMU_CPU_ENGINE "
                            "names it")
        requested = context.environment[CPU_ENGINE_ENV]
    target = numba_target()
    rounding = offset_rounding(target)
    shape_decline = None if shape is None or rounding is None else offset_shape_decline(*shape, rounding)
    return choose_cpu_engine(requested, target, offset_call_decline(preset, schedule, fmt_a, fmt_b),
                             shape_decline, selftest_of(context))


def _tile_accumulators(a, b, fmt_a, fmt_b, preset, fast, splits, scheme):
    return accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, splits, scheme, cpu_engine="tile")


def offset_selftest() -> OffsetSelftest:
    """The process's verdict on the AVX2 offset engine (:mod:`mmaemu.cpu.selftest`, against the tile engine): run
    on the first call, remembered for the process."""
    return process_verdict(lambda: run_offset_selftest(_tile_accumulators))


def selftest_of(context):
    """The AVX2 self-test verdict source of a decision: ``context.cpu_selftest`` when its context gives one, else
    the process's (:func:`offset_selftest`)."""
    source = None if context is None else context.cpu_selftest
    return offset_selftest if source is None else source


def _chosen_engine(preset, schedule, fmt_a, fmt_b, requested, shape, context) -> str:
    """The engine of an :func:`accumulate_codes` call (a caller that did not plan the call), its warnings reported
    (:func:`mmaemu.warn.report`); the context of this moment when none was given and ``requested`` is None."""
    if requested is None:
        context = context_of(context)
    choice = cpu_engine_choice(preset, schedule, fmt_a, fmt_b, requested, shape, context=context)
    report(choice.notices)
    return choice.engine


def accumulate_engine(engine: str, a_codes, b_codes, fmt_a, fmt_b, preset, schedule, params, out, prepared_b=None):
    """The finite path of ``engine`` (a decided "offset" or "tile": no choice is made here) into ``out`` [M, N]
    (float32, C-contiguous; non-empty uint8 codes, C-contiguous, as :func:`mmaemu.arith.params.codes_gemm` gives
    them), B's panels from ``prepared_b`` when given (its engine's :class:`PreparedB`). Returns ``(a_flags,
    b_flags)``, per row of A and of B whether it holds a NaN or Inf code (the caller applies c.4)."""
    if engine == "offset":
        from .offset_engine import accumulate_offset, accumulate_prepared

        if prepared_b is None:
            accumulate_offset(a_codes, b_codes, fmt_a, fmt_b, preset, schedule, params, out)
        else:
            if prepared_b.fmt != fmt_b or prepared_b.shape != b_codes.shape:
                raise ValueError(f"prepared_b was prepared for a {prepared_b.fmt} B of shape {prepared_b.shape}, "
                                 f"not for this {fmt_b} B of shape {b_codes.shape} (offset engine)")
            accumulate_prepared(a_codes, prepared_b, fmt_a, preset, schedule, out)
            return nonfinite_flags(a_codes, fmt_a), prepared_b.nonfinite  # B's flags kept with its panels
        return nonfinite_flags(a_codes, fmt_a), nonfinite_flags(b_codes, fmt_b)
    if prepared_b is not None:
        _check_prepared(prepared_b, b_codes, fmt_b)
    return accumulate_fast(a_codes, b_codes, fmt_a, fmt_b, preset, schedule, params, out, prepared_b)


def accumulate_codes(a_codes, b_codes, fmt_a, fmt_b, preset, use_fast_accum, splits=1, scheme="none", *,
                     reference=False, cpu_engine=None, prepared_b=None, context=None):
    """fp32 accumulators [M, N] of A [M, K] times B [N, K]^T given as uint8 FP8 codes (semantics.md (c), (d)).

    Every format pair is accepted (E5M2 x E5M2 included); non-finite codes follow the rule of c.4.
    ``reference=True`` runs the straightforward loop (one chain walk per output) instead of the fast path;
    ``cpu_engine`` (auto, offset, tile; None: ``MMAEMU_CPU_ENGINE`` of ``context``) picks the fast path's engine
    (:func:`cpu_engine_choice`, with the AVX2 self-test source of ``context``). ``context``: a
    :class:`mmaemu.context.Context`; None (a caller outside a planned call) takes the context of this moment, read
    here, at this entry point, once and only when the choice needs it. ``prepared_b``: B's prepared panels for the
    tile engine (:class:`PreparedB` from :func:`prepare_b`, or the offset engine's
    :class:`mmaemu.cpu.offset_engine.PreparedB`; the fast path then decodes nothing of B): a tile PreparedB runs the
    tile engine whatever ``cpu_engine`` says; it must have been prepared from these codes (the caller's guarantee:
    :mod:`mmaemu.cpu.prepared` checks it).
    """
    gemm = codes_gemm(a_codes, b_codes, fmt_a, fmt_b, preset, use_fast_accum, splits, scheme)
    a_codes, b_codes, schedule, params = gemm.a_codes, gemm.b_codes, gemm.schedule, gemm.params
    out = np.zeros(gemm.shape[:2], np.float32)
    if gemm.empty:
        return out
    if reference:
        sa, ea = decode_operand(a_codes, fmt_a)
        sb, eb = decode_operand(b_codes, fmt_b)
        jobs = -(-sa.shape[0] // TILE_M) * -(-sb.shape[0] // TILE_N)
        job_work = REFERENCE_PRODUCT_WORK * TILE_M * TILE_N * sa.shape[1]
        threads.parallel_for(accumulate_gemm_reference, jobs, job_work, sa, ea, sb, eb, schedule, params, out)
        a_flags = nonfinite_flags(a_codes, fmt_a)
        b_flags = nonfinite_flags(b_codes, fmt_b)
    else:
        engine = "tile" if getattr(prepared_b, "engine", None) == TILE_ENGINE else _chosen_engine(
            preset, schedule, fmt_a, fmt_b, cpu_engine, gemm.shape[:2], context)
        a_flags, b_flags = accumulate_engine(engine, a_codes, b_codes, fmt_a, fmt_b, preset, schedule, params, out,
                                             prepared_b)
    if a_flags.any() or b_flags.any():
        threads.parallel_for(override_nonfinite, out.shape[0], out.shape[1], a_codes, a_flags,
                             formats.values(fmt_a), b_codes, b_flags, formats.values(fmt_b), out.view(np.int32))
    return out


def float32_value(bits: int) -> float:
    """Exact value of an fp32 bit pattern (integer decoding: immune to denormals-are-zero)."""
    return float(value_of_bits(np.int64(bits), FLOAT32))


def epilogue_codes(acc, scale_a_bits, scale_b_bits, scale_result_bits, out_dtype_name):
    """Output bit patterns (unsigned integers of the output's width) of fp32 accumulators (semantics.md (e)).

    Scales are given as fp32 bit patterns; ``scale_result_bits`` None when absent (ignored unless FP8 output).
    """
    acc = np.ascontiguousarray(acc, dtype=np.float32)
    alpha = scale_product(float32_value(scale_a_bits), float32_value(scale_b_bits))
    has_sr = scale_result_bits is not None
    scale_result = float32_value(scale_result_bits) if has_sr else 1.0
    out = np.empty(acc.size, _OUT_VIEW[out_dtype_name])
    threads.parallel_for(epilogue_gemm, acc.size, EPILOGUE_WORK, acc.reshape(-1), alpha, OUT_CODES[out_dtype_name],
                         scale_result, has_sr, out)
    return out.reshape(acc.shape)


def exact_float64(bits, fmt) -> np.ndarray:
    """Exact float64 values of an array of bit patterns (uint32 fp32 or uint16 bf16) in ``fmt``."""
    flat = np.ascontiguousarray(bits).reshape(-1).astype(np.int64)
    out = np.empty(flat.size, np.float64)
    exact_values(flat, fmt, out)
    return out


def rowwise_epilogue_codes(acc, x_scale_bits, w_scale_bits, bias_bits, x_first: bool):
    """bf16 output bits [M, N] (uint16) of torch's row-wise epilogue (:mod:`mmaemu.arith.rowwise`) on fp32
    accumulators ``acc`` [M, N].

    ``x_scale_bits`` [M] and ``w_scale_bits`` [N]: fp32 bit patterns (uint32) of scale_a and scale_b;
    ``bias_bits`` [N]: bf16 bit patterns (uint16), or None for no bias (the kernel adds +0); ``x_first``: the
    kernel multiplies by x_scale[m] first (:func:`mmaemu.platform.rowwise.scale_order`).
    """
    acc = np.ascontiguousarray(acc, dtype=np.float32)
    M, N = acc.shape
    x_scale = exact_float64(x_scale_bits, FLOAT32)
    w_scale = exact_float64(w_scale_bits, FLOAT32)
    bias = np.zeros(N, np.float64) if bias_bits is None else exact_float64(bias_bits, BFLOAT16)
    out = np.empty((M, N), np.uint16)
    threads.parallel_for(rowwise_epilogue_rows, M, max(1, N) * EPILOGUE_WORK, acc, x_scale, w_scale, bias,
                         bool(x_first), out)
    return out

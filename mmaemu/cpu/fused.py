"""A planned tensor-wise GEMM as one compiled call: accumulate, the NaN/Inf rule and the epilogue together.

:func:`mmaemu.cpu.engine.accumulate_codes` then :func:`mmaemu.cpu.engine.epilogue_codes` compute a call in about
ten compiled calls with Python between them (the engine choice, the decode, the tasks, the flags of the NaN/Inf
rule, the scales, the epilogue), some 60 us of Python per call. A call whose plan is kept
(:mod:`mmaemu.plan.cache`) has decided all of that once: :class:`TensorwiseGemm` holds what the plan decided (the
engine, the schedule, the block parameters, the tables, the output format) and :meth:`TensorwiseGemm.run` goes from
the codes and the scales' bits to the output's bits in ONE compiled call per task (one task for a small call),
each doing the products of its outputs (:func:`mmaemu.cpu.gemm.accumulate_prepared_panels` or
:func:`~mmaemu.cpu.gemm.accumulate_panel_rows`), the NaN/Inf rule (:func:`mmaemu.arith.special.
nonfinite_accumulator`) and the epilogue (:func:`mmaemu.arith.epilogue.epilogue_span`) of those outputs. Nothing of
the arithmetic is written here: these are loops over the functions named.

A kept B (:mod:`mmaemu.cpu.prepared`) is still used only for codes byte-identical to those it was prepared from: the
store finds the candidate by the tensor's identity and version, and the call's codes are compared with the kept copy
(:func:`mmaemu.cpu.prepared.same_bytes`) before the tasks run; if they differ, the store is asked again, exactly as
without this module (it compares again, drops the stale B and decides whether to prepare a new one).

The offset engine (:mod:`mmaemu.cpu.offset_engine`) computes its accumulators through its own interface; the
NaN/Inf rule and the epilogue then run as one compiled call per range of rows (:func:`finish_rows`).

A kept row-wise plan (:mod:`mmaemu.recipes.rowwise`) runs the same calls with :class:`RowwiseScales` in place of the
int64 scales: the same products and NaN/Inf rule, then the row-wise epilogue (:func:`mmaemu.cpu.finish.
epilogue_row`, compiled per type of the scales).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from .. import formats
from ..base._jit import arithmetic
from ..arith.epilogue import OUT_CODES
from ..arith.params import BlockParams, Schedule, preset_params, schedule_params
from ..arith.tile import TILE_FORMATS, lane_bits_needed
from . import threads
from .finish import finish_block
from .engine import TILE
from .gemm import FEW_ROWS, accumulate_panel_rows, accumulate_prepared_panels, decode_panel, nonfinite_rows
from .prepared import same_bytes

__all__ = ["TensorwiseGemm", "RowwiseScales", "OUT_VIEWS"]

#: numpy dtype of the output's bit patterns, per output dtype name.
OUT_VIEWS = {"float32": np.uint32, "bfloat16": np.uint16, "float16": np.uint16,
             "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}

# The call's constants in one int64 array (one argument of the compiled calls, whatever the preset):
# the tile format of A (5), the schedule (6), the block parameters (7), then the rest.
_FMT, _SCHEDULE, _PARAMS = 0, 5, 11
TILE_ROWS_AT, MASK_AT, PATTERN_AT, OUT_CODE_AT, LANES_AT, CONSTANTS = 18, 19, 20, 21, 22, 23
# Rows of A up to which a kept call runs the offset method's row tiles (mmaemu.cpu.offset_rows): each row reads the
# whole of B's panels again, so past a few rows the offset kernel's 4-row tile (each B vector loaded once for 4
# rows) or the tile engine is the faster one (docs/performance.md, "One row of A on the offset method").
ROW_KERNEL_ROWS = 2


@arithmetic
def _fmt_of(c):
    return (c[_FMT], c[_FMT + 1], c[_FMT + 2], c[_FMT + 3], c[_FMT + 4])


@arithmetic
def _schedule_of(c):
    s = _SCHEDULE
    return Schedule(c[s], c[s + 1], c[s + 2], c[s + 3], c[s + 4], c[s + 5])


@arithmetic
def _params_of(c):
    p = _PARAMS
    return BlockParams(c[p], c[p + 1], c[p + 2], c[p + 3], c[p + 4], c[p + 5], c[p + 6])


class RowwiseScales(NamedTuple):
    """The scales of a row-wise call (:mod:`mmaemu.recipes.rowwise`) as the compiled calls take them in place of a
    tensor-wise call's int64 ``scales``: the fp32 values of scale_a [M] and scale_b [N] and the bias's values [N]
    (float32 arrays: the fp32 scales' own bits, the bf16 bias widened exactly; no bias: zeros, the kernel adds +0)
    and whether the kernel applies scale_a first (:func:`mmaemu.platform.rowwise.scale_order`). The output is then
    the row-wise epilogue's bf16 (:func:`mmaemu.arith.rowwise.rowwise_epilogue_span`)."""

    x_values: np.ndarray
    w_values: np.ndarray
    bias_values: np.ndarray
    x_first: bool


@arithmetic
def finish_rows(lo, hi, a_codes, a_flags, a_table, b_codes, b_flags, b_table, acc, acc_bits, scales, out_code,
                out_bits):
    """:func:`finish_block` of rows lo .. hi-1, every column (a task of :func:`mmaemu.cpu.threads.parallel_for`)."""
    finish_block(lo, hi, 0, acc.shape[1], a_codes, a_flags, a_table, b_codes, b_flags, b_table, acc, acc_bits,
                 scales, out_code, out_bits)


@arithmetic
def prepared_task(p_lo, p_hi, m_lo, m_hi, a_codes, b_codes, b_val, b_exp, b_flags, a_table, b_table, constants,
                  lane_proto, scales, acc, acc_bits, out_bits):
    """Outputs of rows m_lo .. m_hi-1 and panels p_lo .. p_hi-1 of a prepared B (the tile engine's
    :class:`mmaemu.cpu.engine.PreparedB`: ``b_val``, ``b_exp``, ``b_flags``) to the output's bits (the caller has
    found ``b_codes`` byte-identical to the codes B was prepared from)."""
    M = a_codes.shape[0]
    N = b_codes.shape[0]
    lanes = b_val.shape[2]
    n_lo, n_hi = p_lo * lanes, min(p_hi * lanes, N)
    mask, pattern = constants[MASK_AT], constants[PATTERN_AT]
    a_flags = np.zeros(M, np.bool_)
    accumulate_prepared_panels(p_lo, p_hi, m_lo, m_hi, a_codes, _fmt_of(constants), b_val, b_exp,
                               _schedule_of(constants), _params_of(constants), constants[TILE_ROWS_AT], lane_proto,
                               acc, a_flags, mask, pattern)
    nonfinite_rows(m_lo, m_hi, a_codes, mask, pattern, a_flags)
    finish_block(m_lo, m_hi, n_lo, n_hi, a_codes, a_flags, a_table, b_codes, b_flags, b_table, acc, acc_bits,
                 scales, constants[OUT_CODE_AT], out_bits)
    return True


@arithmetic
def decoded_call(a_codes, b_codes, value_table, exp_table, nonfinite_table, a_table, b_table, constants, lane_proto,
                 scales, acc, acc_bits, out_bits):
    """A whole call of the tile engine on the calling thread, B's panels decoded one by one as the fast path decodes
    them (:func:`mmaemu.cpu.gemm.decode_panel`; the rows of A's NaN/Inf flags found by the first panel's pass)."""
    M, K = a_codes.shape
    N = b_codes.shape[0]
    lanes = constants[LANES_AT]
    mask, pattern = constants[MASK_AT], constants[PATTERN_AT]
    fmt, schedule, params = _fmt_of(constants), _schedule_of(constants), _params_of(constants)
    b_val, b_exp = np.empty((K, lanes), np.float32), np.empty((K, lanes), np.int8)
    a_flags, b_flags = np.zeros(M, np.bool_), np.zeros(N, np.bool_)
    for n0 in range(0, N, lanes):
        decode_panel(b_codes, n0, value_table, exp_table, nonfinite_table, b_val, b_exp, b_flags)
        accumulate_panel_rows(0, M, a_codes, fmt, b_val, b_exp, n0, schedule, params, constants[TILE_ROWS_AT],
                              lane_proto, acc, a_flags, mask, pattern)
    finish_block(0, M, 0, N, a_codes, a_flags, a_table, b_codes, b_flags, b_table, acc, acc_bits, scales,
                 constants[OUT_CODE_AT], out_bits)


class _Tables(NamedTuple):
    a_values: np.ndarray  # float64 values of A's 256 codes (the NaN/Inf rule)
    b_values: np.ndarray
    b_tile_values: np.ndarray  # B's decode into the tile layout (engine.tile_tables, engine.nonfinite_table)
    b_tile_exps: np.ndarray
    b_nonfinite: np.ndarray


class _Cut(NamedTuple):
    """How a kept plan's call is cut into tasks for one thread count (:meth:`TensorwiseGemm._cut`)."""

    one_decoded_task: bool  # B decoded at the call: the fast path has one task (one compiled call, decoded_call)
    prepared_tasks: tuple  # B prepared: (p_lo, p_hi, m_lo, m_hi) of each task of prepared_task
    prepared_works: tuple  # their costs in products (threads.run_tasks)


def _tile_cut(shape, lanes: int, n_threads: int) -> _Cut:
    """The :class:`_Cut` of a call of ``shape`` (M, N, K) with panels of ``lanes`` on ``n_threads`` threads: the
    fast path's tasks (:func:`mmaemu.cpu.engine.fast_path_tasks`); on a prepared B, where every task holds all
    rows, ranges of panels as :func:`mmaemu.threads.job_ranges` cuts them (one compiled call per range), else one
    task per panel and range of rows."""
    from .engine import EPILOGUE_WORK, fast_path_tasks

    M, N, K = shape
    tasks = fast_path_tasks(M, N, K, n_threads)
    row_ranges = sorted({(lo, hi) for _, lo, hi in tasks})
    if len(row_ranges) == 1:  # every task holds all rows: ranges of panels (as accumulate_fast cuts them)
        (m_lo, m_hi), = row_ranges
        panels = -(-N // lanes)
        job_work = (m_hi - m_lo) * lanes * (K + EPILOGUE_WORK)
        prepared = [(p_lo, p_hi, m_lo, m_hi) for p_lo, p_hi in threads.job_ranges(panels, job_work, n_threads)]
    else:
        prepared = [(p, p + 1, lo, hi) for p, lo, hi in tasks]
    works = tuple((m_hi - m_lo) * (p_hi - p_lo) * lanes * (K + EPILOGUE_WORK) for p_lo, p_hi, m_lo, m_hi in prepared)
    return _Cut(len(tasks) == 1, tuple(prepared), works)


class TensorwiseGemm:
    """What a kept plan of a tensor-wise call on the CPU decided, ready for :meth:`run` (see the module docstring):
    the engine ("tile" or "offset", the plan's choice), A [M, K] and B [N, K]'s formats, the preset, the schedule
    of its split, the output dtype's name. Built once per kept plan; shared by the calls (and threads) of it."""

    def __init__(self, engine: str, preset, fmt_a: str, fmt_b: str, M: int, N: int, K: int, use_fast_accum: bool,
                 splits: int, scheme: str, out_name: str, row_tiles: bool = False):
        from .engine import NONFINITE_PATTERN, nonfinite_table, tile_shape, tile_tables

        self.engine, self.preset, self.fmt_a, self.fmt_b = engine, preset, fmt_a, fmt_b
        self.shape, self.out_name = (M, N, K), out_name
        self.schedule = schedule_params(preset, K, use_fast_accum, splits, scheme)
        self.params = preset_params(preset, fmt_a, fmt_b)
        self.out_view = OUT_VIEWS[out_name]
        self.tile_rows, self.lanes = tile_shape(M, N, K)
        mask, pattern = NONFINITE_PATTERN[fmt_a]
        constants = (list(TILE_FORMATS[fmt_a]) + list(self.schedule) + list(self.params)
                     + [self.tile_rows, mask, pattern, OUT_CODES[out_name], self.lanes])
        assert len(constants) == CONSTANTS
        self.constants = np.array(constants, np.int64)
        self.constants.setflags(write=False)
        self.lane_proto = np.empty(0, np.int32 if lane_bits_needed(preset) == 32 else np.int64)
        value_table, exp_table = tile_tables(fmt_b)
        self.tables = _Tables(formats.values(fmt_a), formats.values(fmt_b), value_table, exp_table,
                              nonfinite_table(fmt_b))
        self._cuts = {}  # thread count -> _Cut (a dict read and written whole: safe across threads)
        # A kept B of a call of few rows on the offset method's row tiles (mmaemu.cpu.offset_rows), where the plan
        # allows it (row_tiles: :func:`row_tiles_fit`): the constants of that compiled call, else None.
        self.rows = _RowsCall.of(self) if row_tiles else None

    def run(self, a_codes, b_codes, scales, weights=None, b_tensor=None):
        """The output's bits [M, N] (:data:`OUT_VIEWS`) of A's codes [M, K] times B's codes [N, K]^T (uint8,
        C-contiguous, the plan's shape) with the scales' bits ``scales`` (int64 [4]:
        :data:`mmaemu.cpu.finish.SCALE_A`, ...), or of a row-wise call with its :class:`RowwiseScales` (made with
        ``out_name`` "bfloat16").
        ``weights``: where B's prepared panels are kept (:mod:`mmaemu.cpu.prepared`; ``b_tensor``, B's tensor or
        its :class:`~mmaemu.cpu.prepared.WeightRef`, finds them), or None: decoded for this call."""
        M, N, K = self.shape
        acc = np.empty((M, N), np.float32)
        out_bits = np.empty((M, N), self.out_view)
        if self.engine == "tile":
            self._tile(a_codes, b_codes, scales, weights, b_tensor, acc, out_bits)
        else:
            self._offset(a_codes, b_codes, scales, weights, b_tensor, acc, out_bits)
        return out_bits

    # -- the tile engine -------------------------------------------------------------------------------------------

    def _cut(self, n_threads: int) -> "_Cut":
        """How a call of this plan is cut for ``n_threads`` threads (:class:`_Cut`), decided once per thread
        count: the same decisions as :func:`mmaemu.cpu.engine.fast_path_tasks` and
        :func:`mmaemu.threads.job_ranges` take at every call, which are pure functions of the shape and the
        thread count."""
        cut = self._cuts.get(n_threads)
        if cut is None:
            cut = self._cuts[n_threads] = _tile_cut(self.shape, self.lanes, n_threads)
        return cut

    def _tile(self, a_codes, b_codes, scales, weights, b_tensor, acc, out_bits):
        n_threads = threads.num_threads()
        cut = self._cut(n_threads)
        if weights is not None and self.rows is not None and (n_threads == 1 or len(cut.prepared_tasks) == 1):
            # row tiles run on the calling thread: only where the tile engine's kept call is one task too, or there
            # is one thread (a call of more work keeps its panel ranges on every thread)
            if self.rows.run(self, weights, b_tensor, a_codes, b_codes, scales, acc, out_bits):
                return
            weights = None  # B not kept yet (seen once): decoded for this call, no tile panels kept beside it
        if weights is not None:
            kept = weights.candidate(TILE, self.fmt_b, b_tensor)
            if kept is not None and self._prepared(cut, kept.prepared, kept.codes, a_codes, b_codes, scales, acc,
                                                   out_bits):
                return
            prepared = weights.prepared(TILE, self.fmt_b, b_tensor, b_codes)  # compares, drops, prepares as before
            if prepared is not None and self._prepared(cut, prepared, None, a_codes, b_codes, scales, acc,
                                                       out_bits):
                return
        t = self.tables
        if cut.one_decoded_task:
            decoded_call(a_codes, b_codes, t.b_tile_values, t.b_tile_exps, t.b_nonfinite, t.a_values, t.b_values,
                         self.constants, self.lane_proto, scales, acc, acc.view(np.int32), out_bits)
            return
        from .engine import accumulate_fast

        a_flags, b_flags = accumulate_fast(a_codes, b_codes, self.fmt_a, self.fmt_b, self.preset, self.schedule,
                                           self.params, acc)
        self._finish(a_codes, a_flags, b_codes, b_flags, scales, acc, out_bits)

    def _prepared(self, cut, prepared, kept_codes, a_codes, b_codes, scales, acc, out_bits) -> bool:
        """The call on a prepared B, in the tasks ``cut.prepared_tasks`` of :func:`prepared_task`;
        ``kept_codes``: the codes it was prepared from, compared with ``b_codes`` first (None: prepared from them
        in this call). False: they differ."""
        if prepared.shape != b_codes.shape or prepared.fmt != self.fmt_b:
            return False
        flat = b_codes.reshape(-1)
        if kept_codes is not None and not same_bytes(kept_codes, flat):
            return False
        t = self.tables
        acc_bits = acc.view(np.int32)
        b_val = prepared.val16 if self.shape[0] <= FEW_ROWS else prepared.val  # as accumulate_fast reads them
        tasks = cut.prepared_tasks

        def task(p_lo, p_hi, m_lo, m_hi):
            prepared_task(p_lo, p_hi, m_lo, m_hi, a_codes, b_codes, b_val, prepared.exp, prepared.nonfinite,
                          t.a_values, t.b_values, self.constants, self.lane_proto, scales, acc, acc_bits, out_bits)

        if len(tasks) == 1:
            task(*tasks[0])
        else:
            threads.run_tasks([lambda job=job: task(*job) for job in tasks], cut.prepared_works)
        return True

    # -- the offset engine -----------------------------------------------------------------------------------------

    def _offset(self, a_codes, b_codes, scales, weights, b_tensor, acc, out_bits):
        from .engine import OFFSET, accumulate_engine

        prepared = None if weights is None else weights.prepared(OFFSET, self.fmt_b, b_tensor, b_codes)
        a_flags, b_flags = accumulate_engine("offset", a_codes, b_codes, self.fmt_a, self.fmt_b, self.preset,
                                             self.schedule, self.params, acc, prepared)  # flags computed once
        self._finish(a_codes, a_flags, b_codes, b_flags, scales, acc, out_bits)

    def _finish(self, a_codes, a_flags, b_codes, b_flags, scales, acc, out_bits):
        """The NaN/Inf rule and the epilogue of every output, in parallel over ranges of rows."""
        from .engine import EPILOGUE_WORK

        M, N, _ = self.shape
        t = self.tables
        threads.parallel_for(finish_rows, M, max(1, N) * EPILOGUE_WORK, a_codes, a_flags, t.a_values, b_codes,
                             b_flags, t.b_values, acc, acc.view(np.int32), scales, OUT_CODES[self.out_name],
                             out_bits)


def row_tiles_fit(engine: str, M: int, offset_choice: str, rounding) -> bool:
    """Whether a kept plan's calls with a kept B run on the offset method's row tiles (:mod:`mmaemu.cpu.offset_rows`):
    the plan's engine is the tile engine (``auto`` keeps it for few rows: the offset kernel's 4-row tile is slower
    there), M is at most :data:`ROW_KERNEL_ROWS`, the offset method computes the call on this
    CPU (``offset_choice``: the engine :func:`mmaemu.cpu.engine.cpu_engine_choice` gives for the call's request
    without a shape rule: "tile" where ``MMAEMU_CPU_ENGINE=tile`` forces it, the method does not fit or the CPU
    cannot), and the CPU rounds by AVX-512's embedded rounding (``rounding``, :func:`mmaemu.cpu.features.
    offset_rounding`: where the row tiles were measured faster; docs/performance.md). Same bits either way."""
    from .features import ROUNDING_EMBEDDED

    return engine == "tile" and offset_choice == "offset" and rounding == ROUNDING_EMBEDDED and M <= ROW_KERNEL_ROWS


class _RowsCall(NamedTuple):
    """What the compiled call of row tiles (:func:`mmaemu.cpu.offset_rows.rows_call`) takes of a kept plan: its
    constants in one array (:func:`mmaemu.cpu.offset_rows.call_words`) and A's packing tables."""

    words: np.ndarray
    a_tables: tuple  # the offset engine's packing tables of A's format (values, exponent bytes, lows, signs)
    kernel: object  # rows_call, or where the CPU rounds by MXCSR rows_call restoring it also when it raises
    store_engine: object  # mmaemu.cpu.engine.OFFSET: the kept form of B is the offset engine's

    @staticmethod
    def of(gemm: "TensorwiseGemm") -> "_RowsCall":
        from ..arith.offset import ADD_MAX, offset_params
        from .engine import NONFINITE_PATTERN, OFFSET
        from .features import ROUNDING_EMBEDDED, numba_target, offset_rounding
        from .offset_engine import packing_tables
        from .offset_kernel import MASKS
        from .offset_rows import call_words, rows_call
        from .simd import call_restoring_mxcsr

        words = call_words(offset_params(gemm.params, gemm.fmt_a, gemm.fmt_b, ADD_MAX), gemm.schedule, MASKS,
                           NONFINITE_PATTERN[gemm.fmt_a], NONFINITE_PATTERN[gemm.fmt_b], gemm.shape[2],
                           OUT_CODES[gemm.out_name])
        kernel = rows_call
        if offset_rounding(numba_target()) != ROUNDING_EMBEDDED:
            kernel = functools.partial(call_restoring_mxcsr, rows_call)
        return _RowsCall(words, packing_tables(gemm.fmt_a), kernel, OFFSET)

    def run(self, gemm, weights, b_tensor, a_codes, b_codes, scales, acc, out_bits) -> bool:
        """The call on the kept B (the offset engine's packed panels, :data:`mmaemu.cpu.engine.OFFSET`): True when
        computed; False when B is not kept (yet). Codes that differ from the kept copy make the store compare again,
        drop the stale B and decide whether to prepare a new one (:meth:`mmaemu.cpu.prepared.PreparedStore.
        prepared`), exactly as on the tile engine's kept path."""
        kept = weights.candidate(self.store_engine, gemm.fmt_b, b_tensor)
        if kept is not None and self._call(gemm, kept.prepared, kept.codes, a_codes, b_codes, scales, acc,
                                           out_bits):
            return True
        prepared = weights.prepared(self.store_engine, gemm.fmt_b, b_tensor, b_codes)
        return prepared is not None and self._call(gemm, prepared, b_codes.reshape(-1), a_codes, b_codes, scales,
                                                   acc, out_bits)

    def _call(self, gemm, prepared, kept_codes, a_codes, b_codes, scales, acc, out_bits) -> bool:
        if prepared.shape != b_codes.shape or prepared.fmt != gemm.fmt_b or kept_codes.size != b_codes.size:
            return False
        t, (values, exps, lows, signs) = gemm.tables, self.a_tables
        return bool(self.kernel(self.words, kept_codes, b_codes, prepared.val, prepared.exp, prepared.low,
                                prepared.sign, a_codes, values, exps, lows, signs, t.a_values, t.b_values, scales,
                                acc, out_bits))

"""The CPU's offset engine (:mod:`.offset_kernel`): which calls it computes, B's packed panels, and the tasks.

Two steps, so that B's packing can be kept across calls (a weight's panels):

* :func:`prepare_b` packs B once into :class:`PreparedB`;
* :func:`accumulate_prepared` computes the fp32 accumulators of A against a :class:`PreparedB`, like
  :func:`mmaemu.cpu.engine.accumulate_fast`.

Whether the engine can run at all is :func:`mmaemu.cpu.features.offset_engine_decline` (the CPU Numba compiles
for); whether it computes a call is :func:`mmaemu.cpu.features.offset_call_decline` (preset, schedule, formats).
This module is imported only where the offset engine runs.
"""

from __future__ import annotations

import threading
from typing import NamedTuple, Optional

import numpy as np

from ..arith.offset import ADD_MAX, offset_params, offset_tables
from ..arith.params import Schedule, preset_params
from . import threads
from .offset_kernel import MASKS, PANEL, ROWS, offset_panel_rows, pack_panels, pack_row_blocks, padded_k
from .simd import call_restoring_mxcsr

class PreparedB(NamedTuple):
    """B [N, K] packed for the offset engine (:mod:`.offset_kernel`'s layout), read-only: ``panels`` panels of
    PANEL columns, K padded with zero codes to a multiple of 16. Depends on B's codes and format only (not on A's
    format, the preset or the schedule), so one PreparedB serves every call with that B."""

    fmt: str
    shape: tuple  # (N, K) of B's codes
    engine = "offset"  # the engine that prepared it (mmaemu.cpu.prepared keys on it)
    val: np.ndarray  # float32 [panels, Kp, PANEL]
    exp: np.ndarray  # uint32 [panels, Kp // 2, PANEL]
    low: np.ndarray  # uint32 [panels, Kp // 4, PANEL]
    sign: np.ndarray  # uint32 [panels, Kp // 4, PANEL]

    @property
    def nbytes(self) -> int:
        """Memory held: 8 bytes per packed element."""
        return self.val.nbytes + self.exp.nbytes + self.low.nbytes + self.sign.nbytes


_TABLES = {}


def packing_tables(fmt: str):
    """:func:`mmaemu.arith.offset.offset_tables` of a format (add-max exponents), computed once, read-only."""
    if fmt not in _TABLES:
        tables = offset_tables(fmt, ADD_MAX)
        for t in tables:
            t.setflags(write=False)
        _TABLES[fmt] = tables
    return _TABLES[fmt]


def prepare_b(b_codes: np.ndarray, fmt_b: str) -> PreparedB:
    """B's FP8 codes [N, K] (uint8, any layout) packed into the offset engine's panels.

    Contract: the result depends only on the codes' values, their shape and ``fmt_b``; it holds no reference to
    ``b_codes`` (a cache may keep it while B's storage changes, keyed on what changes B). Its arrays are
    read-only. Cost: one pass over B; memory 8 bytes per element of B (rounded up to whole panels and 16 k).
    """
    b_codes = np.ascontiguousarray(b_codes, dtype=np.uint8)
    N, K = b_codes.shape
    panels, kp = max(1, -(-N // PANEL)), padded_k(K)
    val = np.empty((panels, kp, PANEL), np.float32)
    exp = np.empty((panels, kp // 2, PANEL), np.uint32)
    low = np.empty((panels, kp // 4, PANEL), np.uint32)
    sign = np.empty((panels, kp // 4, PANEL), np.uint32)
    threads.parallel_for(pack_panels, panels, 8 * kp * PANEL, b_codes, packing_tables(fmt_b), val, exp, low, sign)
    for array in (val, exp, low, sign):
        array.setflags(write=False)
    return PreparedB(fmt_b, (N, K), val, exp, low, sign)


def offset_tasks(M: int, panels: int, K: int, n_threads: int):
    """The tasks, ``(panel, m_lo, m_hi)``: every panel with each range of row pairs of A
    (:func:`mmaemu.cpu.threads.job_ranges`; a job: one tile of ROWS rows), panel by panel."""
    row_tiles = -(-M // ROWS)
    ranges = threads.job_ranges(row_tiles, ROWS * PANEL * K, n_threads, repeats=panels)
    return [(p, lo * ROWS, min(hi * ROWS, M)) for p in range(panels) for lo, hi in ranges]


def accumulate_prepared(a_codes, prepared: PreparedB, fmt_a: str, preset, schedule, out, constants=None,
                        masks=MASKS):
    """``out`` [M, N] (float32, C-contiguous) = the fp32 accumulators of A [M, K] (uint8 codes, C-contiguous)
    times the prepared B, for finite codes (the caller applies c.4 to rows with NaN or Inf codes, as
    :func:`mmaemu.cpu.engine.accumulate_fast`'s callers do). ``preset``/``schedule``: as accumulate_fast takes them;
    the call must satisfy :func:`~mmaemu.cpu.features.offset_call_decline` and the CPU :func:`mmaemu.cpu.features.offset_engine_decline`.

    Contract: ``prepared`` is only read (any number of calls, from any threads, may share it); its K must be A's.
    ``constants``: the block step's :class:`~mmaemu.arith.offset.OffsetConstants`,
    :func:`mmaemu.arith.offset.offset_params` by default, and ``masks`` the bit masks
    (:data:`mmaemu.cpu.offset_kernel.MASKS`): tests give altered ones to show that each matters.
    """
    if prepared.shape[1] != a_codes.shape[1]:
        raise ValueError(f"prepared B has K={prepared.shape[1]}, A has K={a_codes.shape[1]}")

    def panel_of(p):
        return prepared.val[p], prepared.exp[p], prepared.low[p], prepared.sign[p]

    _run(a_codes, fmt_a, prepared.fmt, prepared.val.shape[0], panel_of, lambda p: None, preset, schedule, out,
         constants, masks)


class PanelsOnDemand:
    """B's panels packed by the first task that needs each and dropped after its last one (``uses`` tasks per
    panel), as :class:`mmaemu.cpu.engine.DecodedPanels` does for the tile engine: tasks are handed out panel by
    panel, so about one panel per thread is held at a time (a call without a kept :class:`PreparedB`)."""

    def __init__(self, b_codes, fmt_b: str, uses: int):
        self._codes, self._tables, self._kp = b_codes, packing_tables(fmt_b), padded_k(b_codes.shape[1])
        self.count = max(1, -(-b_codes.shape[0] // PANEL))
        self._locks = [threading.Lock() for _ in range(self.count)]
        self._left = [uses] * self.count
        self._packed = {}

    def acquire(self, p: int):
        with self._locks[p]:
            if p not in self._packed:
                kp, width = self._kp, PANEL
                arrays = (np.empty((1, kp, width), np.float32), np.empty((1, kp // 2, width), np.uint32),
                          np.empty((1, kp // 4, width), np.uint32), np.empty((1, kp // 4, width), np.uint32))
                pack_panels(0, 1, self._codes[p * width:(p + 1) * width], self._tables, *arrays)
                self._packed[p] = tuple(x[0] for x in arrays)
            return self._packed[p]

    def release(self, p: int):
        with self._locks[p]:
            self._left[p] -= 1
            if not self._left[p]:
                del self._packed[p]


def pack_a(a_codes, fmt_a: str):
    """A's codes [M, K] packed once per call, a column per row (M rounded up to whole tiles of ROWS rows, K to
    whole passes; zero codes there): the four arrays every task reads."""
    M, K = a_codes.shape
    kp, columns = padded_k(K), max(ROWS, -(-M // ROWS) * ROWS)
    arrays = (np.empty((kp, columns), np.float32), np.empty((kp // 2, columns), np.uint32),
              np.empty((kp // 4, columns), np.uint32), np.empty((kp // 4, columns), np.uint32))
    threads.parallel_for(pack_row_blocks, -(-columns // PANEL), 8 * kp * PANEL, a_codes, packing_tables(fmt_a),
                         *arrays)
    return arrays


def _run(a_codes, fmt_a, fmt_b, panels, acquire, release, preset, schedule, out, constants, masks):
    """The tasks of :func:`offset_tasks` on the threads; ``acquire(p)`` gives panel p's four arrays and
    ``release(p)`` is called after each task that used it."""
    M, K = a_codes.shape
    if constants is None:
        constants = offset_params(preset_params(preset, fmt_a, fmt_b), fmt_a, fmt_b, ADD_MAX)
    schedule = Schedule(*(int(v) for v in schedule))
    a = pack_a(a_codes, fmt_a)

    def task(panel, m_lo, m_hi):
        try:
            call_restoring_mxcsr(offset_panel_rows, m_lo, m_hi, a, acquire(panel), panel * PANEL, K, schedule,
                                 constants, masks, out)
        finally:
            release(panel)

    tasks = offset_tasks(M, panels, K, threads.num_threads())
    threads.run_tasks([lambda t=t: task(*t) for t in tasks], [(hi - lo) * PANEL * K for _, lo, hi in tasks])


def accumulate_offset(a_codes, b_codes, fmt_a, fmt_b, preset, schedule, params, out):
    """:func:`mmaemu.cpu.engine.accumulate_fast`'s interface on the offset engine (``params``, the preset's
    :class:`~mmaemu.arith.params.BlockParams`, is implied by the preset and the formats): B's panels packed on
    demand (:class:`PanelsOnDemand`), the same bits as :func:`prepare_b` then :func:`accumulate_prepared`."""
    M, K = a_codes.shape
    panels = max(1, -(-b_codes.shape[0] // PANEL))
    uses = len(offset_tasks(M, panels, K, threads.num_threads())) // panels
    on_demand = PanelsOnDemand(b_codes, fmt_b, uses)
    _run(a_codes, fmt_a, fmt_b, on_demand.count, on_demand.acquire, on_demand.release, preset, schedule, out, None,
         MASKS)

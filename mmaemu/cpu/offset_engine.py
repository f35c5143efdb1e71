"""The CPU's offset engine (:mod:`.offset_kernel`): which calls it computes, B's packed panels, and the tasks.

Two steps, so that B's packing can be kept across calls (a weight's panels):

* :func:`prepare_b` packs B once into :class:`PreparedB`;
* :func:`accumulate_prepared` computes the fp32 accumulators of A against a :class:`PreparedB`, like
  :func:`mmaemu.cpu.engine.accumulate_fast`.

Whether the engine can run at all is :func:`mmaemu.cpu.features.offset_engine_decline` (the CPU Numba compiles
for); whether it computes a call is :func:`offset_call_decline` (preset, schedule, formats).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from ..arith.offset import ADD_MAX, offset_decline, offset_floor_decline, offset_params, offset_tables
from ..arith.params import Schedule, preset_params
from . import threads

# The byte counters hold nfma / 4 products each and their sum is taken by one multiply (offset_kernel docstring).
MAX_NFMA = 255


class PreparedB(NamedTuple):
    """B [N, K] packed for the offset engine (:mod:`.offset_kernel`'s layout), read-only: ``panels`` panels of
    PANEL columns, K padded with zero codes to a multiple of 16. Depends on B's codes and format only (not on A's
    format, the preset or the schedule), so one PreparedB serves every call with that B."""

    fmt: str
    shape: tuple  # (N, K) of B's codes
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


def offset_call_decline(preset, schedule, fmt_a: str, fmt_b: str) -> Optional[str]:
    """Why the offset engine does not compute a call (None if it does): the method's conditions
    (:func:`mmaemu.arith.offset.offset_decline`: early-accumulator presets whose block sums fit the window,
    frac_out >= frac, nfma a multiple of 16; :func:`~mmaemu.arith.offset.offset_floor_decline`), nfma <= MAX_NFMA (the byte counters), and k-tiles that whole blocks
    fill (split or slow schedules: nfma divides the tile, so no block ends inside a tile before K)."""
    params = preset_params(preset, fmt_a, fmt_b)
    nfma, frac = params.nfma, params.frac
    why = offset_decline(nfma, frac, params.frac_out, params.late_c) or offset_floor_decline(params.min_exp, frac)
    if why is not None:
        return why
    if nfma > MAX_NFMA:
        return f"counts corrections in bytes, which needs nfma <= {MAX_NFMA} (nfma={nfma})"
    schedule = Schedule(*(int(v) for v in schedule))
    if (schedule.splits > 1 or schedule.chain_tiles) and schedule.tile % nfma:
        return f"needs k-tiles of whole blocks, the schedule's tiles are {schedule.tile} wide and nfma={nfma}"
    return None


def prepare_b(b_codes: np.ndarray, fmt_b: str) -> PreparedB:
    """B's FP8 codes [N, K] (uint8, any layout) packed into the offset engine's panels.

    Contract: the result depends only on the codes' values, their shape and ``fmt_b``; it holds no reference to
    ``b_codes`` (a cache may keep it while B's storage changes, keyed on what changes B). Its arrays are
    read-only. Cost: one pass over B; memory 8 bytes per element of B (rounded up to whole panels and 16 k).
    """
    from .offset_kernel import PANEL, pack_panels, padded_k

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
    from .offset_kernel import PANEL, ROWS

    row_tiles = -(-M // ROWS)
    ranges = threads.job_ranges(row_tiles, ROWS * PANEL * K, n_threads, repeats=panels)
    return [(p, lo * ROWS, min(hi * ROWS, M)) for p in range(panels) for lo, hi in ranges]


def accumulate_prepared(a_codes, prepared: PreparedB, fmt_a: str, preset, schedule, out, constants=None):
    """``out`` [M, N] (float32, C-contiguous) = the fp32 accumulators of A [M, K] (uint8 codes, C-contiguous)
    times the prepared B, for finite codes (the caller applies c.4 to rows with NaN or Inf codes, as
    :func:`mmaemu.cpu.engine.accumulate_fast`'s callers do). ``preset``/``schedule``: as accumulate_fast takes them;
    the call must satisfy :func:`offset_call_decline` and the CPU :func:`mmaemu.cpu.features.offset_engine_decline`.

    Contract: ``prepared`` is only read (any number of calls, from any threads, may share it); its K must be A's.
    ``constants``: the block step's :class:`~mmaemu.arith.offset.OffsetConstants`,
    :func:`mmaemu.arith.offset.offset_params` by default (tests give altered ones to show that each matters).
    """
    from .offset_kernel import offset_panel_rows

    M, K = a_codes.shape
    if prepared.shape[1] != K:
        raise ValueError(f"prepared B has K={prepared.shape[1]}, A has K={K}")
    if constants is None:
        constants = offset_params(preset_params(preset, fmt_a, prepared.fmt), fmt_a, prepared.fmt, ADD_MAX)
    schedule = Schedule(*(int(v) for v in schedule))
    a_tables = packing_tables(fmt_a)
    tasks = offset_tasks(M, prepared.val.shape[0], K, threads.num_threads())
    from .offset_kernel import PANEL

    def task(panel, m_lo, m_hi):
        offset_panel_rows(m_lo, m_hi, a_codes, a_tables, prepared.val[panel], prepared.exp[panel],
                          prepared.low[panel], prepared.sign[panel], panel * PANEL, schedule, constants, out)

    threads.run_tasks(lambda t=t: task(*t) for t in tasks)


def accumulate_offset(a_codes, b_codes, fmt_a, fmt_b, preset, schedule, params, out):
    """:func:`mmaemu.cpu.engine.accumulate_fast`'s interface on the offset engine: :func:`prepare_b` then
    :func:`accumulate_prepared` (``params``, the preset's integer tuple, is implied by the preset)."""
    accumulate_prepared(a_codes, prepare_b(b_codes, fmt_b), fmt_a, preset, schedule, out)

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

from typing import NamedTuple

import numpy as np

from .. import formats
from ..arith.offset import (ADD_MAX, EXPONENT_BYTE_ABSENT, SIGN_BYTE, ZERO_LOW, exponent_bytes, format_low_range,
                            offset_params, offset_tables)
from ..arith.params import Schedule, preset_params
from . import threads
from .nonfinite import nonfinite_flags
from .offset_kernel import (MASKS, PANEL, ROWS, TILE_WORDS, CodeDecode, Operand, offset_codes_task,
                            offset_prepared_task, pack_panel, pack_panels_task, pack_tiles, padded_k)
from .simd import call_restoring_mxcsr

# The cost of packing one element, in products of the fast path (threads' units): A's tiles (by table) about 1 ns,
# B's panels (by vectors, :func:`~.offset_kernel.decode_words`) about 0.3 ns (docs/performance.md).
PACK_WORK = 10
B_PACK_WORK = 3


class PreparedB(NamedTuple):
    """B [N, K] packed for the offset engine (:mod:`.offset_kernel`'s layout), read-only: ``panels`` panels of
    PANEL columns, K padded with zero codes to a multiple of 16. Depends on B's codes and format only (not on A's
    format, the preset or the schedule), so one PreparedB serves every call with that B."""

    fmt: str
    shape: tuple  # (N, K) of B's codes
    engine = "offset"  # the engine that prepared it (mmaemu.cpu.prepared keys on it)
    val: np.ndarray  # float32 [panels, Kp, PANEL]
    exp: np.ndarray  # int8 [panels, Kp, PANEL]
    low: np.ndarray  # uint32 [panels, Kp // 4, PANEL]
    sign: np.ndarray  # uint32 [panels, Kp // 4, PANEL]
    nonfinite: np.ndarray  # bool [N]: row n of B holds a NaN or Inf code (a kept call's B flags, not recomputed)

    @property
    def nbytes(self) -> int:
        """Memory held: 7 bytes per packed element and B's row flags."""
        return self.val.nbytes + self.exp.nbytes + self.low.nbytes + self.sign.nbytes + self.nonfinite.nbytes

    @property
    def operand(self) -> Operand:
        """The four arrays as the kernel reads them."""
        return Operand(self.val, self.exp, self.low, self.sign)


_TABLES = {}


def packing_tables(fmt: str):
    """(values float32[256], exponent bytes int8[256], low bytes uint32[256], sign bytes uint32[256]) of a format's
    codes: :func:`mmaemu.arith.offset.offset_tables` (add-max) with :func:`mmaemu.arith.offset.exponent_bytes` for
    its exponents, computed once, read-only."""
    if fmt not in _TABLES:
        values, _, lows, signs = offset_tables(fmt, ADD_MAX)
        tables = (values, exponent_bytes(fmt), lows, signs)
        for t in tables:
            t.setflags(write=False)
        _TABLES[fmt] = tables
    return _TABLES[fmt]


_DECODES = {}


def every_code_panel() -> np.ndarray:
    """B's codes [PANEL, 16] holding each of the 256 codes at each of the four byte positions of a 4-k word
    (column k % 4) exactly once: code ``(j + 64 * (k // 4)) % 256`` at row j, column k."""
    rows, columns = np.arange(PANEL)[:, None], np.arange(16)[None, :]
    return ((rows + PANEL * (columns // 4)) % 256).astype(np.uint8)


def code_decode(fmt: str) -> CodeDecode:
    """The fields of ``fmt``'s codes for the panel decode (:func:`~.offset_kernel.decode_words`: B's panels are
    decoded by arithmetic on vectors, not by table, docs/performance.md), computed once. Raises ValueError unless
    the panel of :func:`every_code_panel` packed by :func:`~.offset_kernel.pack_panel` holds
    :func:`packing_tables`' entries for all 256 codes at every byte position, bit for bit: the tables stay the
    definition, and the check runs the decode the engine runs."""
    if fmt not in _DECODES:
        values = np.asarray(formats.values(fmt), np.float64)
        mbits = formats.MANT_BITS[fmt]
        special = min([m for m in range(128) if not np.isfinite(values[m])], default=128)
        decode = CodeDecode(mbits, formats.EMIN[fmt], special, -mbits - format_low_range(fmt)[0], ZERO_LOW,
                            EXPONENT_BYTE_ABSENT, SIGN_BYTE)
        codes = every_code_panel()
        K = codes.shape[1]
        panel = Operand(np.empty((K, PANEL), np.float32), np.empty((K, PANEL), np.int8),
                        np.empty((K // 4, PANEL), np.uint32), np.empty((K // 4, PANEL), np.uint32))
        pack_panel(codes, 0, decode, panel, np.empty((K // 4, PANEL), np.uint32))
        values, exps, lows, signs = packing_tables(fmt)
        shifts = (8 * np.arange(4, dtype=np.uint32))[None, :, None]
        words = codes.T.reshape(K // 4, 4, PANEL)  # [group, byte position, column]
        if not (np.array_equal(panel.val.view(np.uint32), values[codes.T].view(np.uint32))
                and np.array_equal(panel.exp, exps[codes.T])
                and np.array_equal(panel.low, np.bitwise_or.reduce(lows[words].astype(np.uint32) << shifts, 1))
                and np.array_equal(panel.sign, np.bitwise_or.reduce(signs[words].astype(np.uint32) << shifts, 1))):
            raise ValueError(f"the arithmetic decode of {fmt}'s codes differs from its tables")
        _DECODES[fmt] = decode
    return _DECODES[fmt]


def prepare_b(b_codes: np.ndarray, fmt_b: str) -> PreparedB:
    """B's FP8 codes [N, K] (uint8, any layout) packed into the offset engine's panels.

    Contract: the result depends only on the codes' values, their shape and ``fmt_b``; it holds no reference to
    ``b_codes`` (a cache may keep it while B's storage changes, keyed on what changes B). Its arrays are
    read-only. Cost: one pass over B (about 0.3 ns per element); memory 7 bytes per element of B (rounded up to whole
    panels and 16 k).
    """
    b_codes = np.ascontiguousarray(b_codes, dtype=np.uint8)
    N, K = b_codes.shape
    panels, kp = max(1, -(-N // PANEL)), padded_k(K)
    prepared = Operand(np.empty((panels, kp, PANEL), np.float32), np.empty((panels, kp, PANEL), np.int8),
                       np.empty((panels, kp // 4, PANEL), np.uint32), np.empty((panels, kp // 4, PANEL), np.uint32))
    threads.parallel_for(pack_panels_task, panels, B_PACK_WORK * kp * PANEL, b_codes, code_decode(fmt_b), prepared)
    arrays = (*prepared, nonfinite_flags(b_codes, fmt_b))
    for array in arrays:
        array.setflags(write=False)
    return PreparedB(fmt_b, (N, K), *arrays)


def offset_tasks(M: int, panels: int, K: int, n_threads: int):
    """The tasks, ``(p_lo, p_hi, m_lo, m_hi)``: where one range of rows takes every row
    (:func:`mmaemu.cpu.threads.job_ranges`; a job: one tile of ROWS rows and a panel), ranges of panels against all
    rows; otherwise every panel with each range of rows, panel by panel."""
    row_tiles = max(1, -(-M // ROWS))
    row_ranges = threads.job_ranges(row_tiles, ROWS * PANEL * K, n_threads, repeats=panels)
    if len(row_ranges) == 1:
        return [(lo, hi, 0, M) for lo, hi in threads.job_ranges(panels, row_tiles * ROWS * PANEL * K, n_threads)]
    return [(p, p + 1, lo * ROWS, min(hi * ROWS, M)) for p in range(panels) for lo, hi in row_ranges]


def pack_a(a_codes, fmt_a: str) -> np.ndarray:
    """A's codes [M, K] packed once per call (:func:`~.offset_kernel.pack_tiles`: rows rounded up to whole tiles of
    ROWS rows, K to whole passes; zero codes there): the tile-major words every task reads, uint32 [tiles * groups,
    TILE_WORDS] (tile t's 4-k group g in row ``t * groups + g``; groups = Kp / 4)."""
    M, K = a_codes.shape
    tiles, groups = max(1, -(-M // ROWS)), padded_k(K) // 4
    packed = np.empty((tiles, groups, TILE_WORDS), np.uint32)
    threads.parallel_for(pack_tiles, tiles, PACK_WORK * 4 * groups * ROWS, a_codes, packing_tables(fmt_a), packed)
    return packed.reshape(tiles * groups, TILE_WORDS)


def _constants(preset, fmt_a, fmt_b, constants):
    if constants is None:
        constants = offset_params(preset_params(preset, fmt_a, fmt_b), fmt_a, fmt_b, ADD_MAX)
    return constants


def _run(kernel, tasks, K, *args):
    """``kernel(p_lo, p_hi, m_lo, m_hi, *args)`` for every task on the threads (each restoring MXCSR)."""
    threads.run_tasks([lambda t=t: call_restoring_mxcsr(kernel, *t, *args) for t in tasks],
                      [(p_hi - p_lo) * (m_hi - m_lo) * PANEL * K for p_lo, p_hi, m_lo, m_hi in tasks])


def accumulate_prepared(a_codes, prepared: PreparedB, fmt_a: str, preset, schedule, out, constants=None,
                        masks=MASKS):
    """``out`` [M, N] (float32, C-contiguous) = the fp32 accumulators of A [M, K] (uint8 codes, C-contiguous)
    times the prepared B, for finite codes (the caller applies c.4 to rows with NaN or Inf codes, as
    :func:`mmaemu.cpu.engine.accumulate_fast`'s callers do). ``preset``/``schedule``: as accumulate_fast takes them;
    the call must satisfy :func:`~mmaemu.cpu.features.offset_call_decline` and the CPU
    :func:`mmaemu.cpu.features.offset_engine_decline`.

    Contract: ``prepared`` is only read (any number of calls, from any threads, may share it); its K must be A's.
    ``constants``: the block step's :class:`~mmaemu.arith.offset.OffsetConstants`,
    :func:`mmaemu.arith.offset.offset_params` by default, and ``masks`` the bit masks
    (:class:`mmaemu.cpu.offset_kernel.BitMasks`, :data:`~mmaemu.cpu.offset_kernel.MASKS`): tests give altered ones
    to show that each matters.
    """
    if prepared.shape[1] != a_codes.shape[1]:
        raise ValueError(f"prepared B has K={prepared.shape[1]}, A has K={a_codes.shape[1]}")
    M, K = a_codes.shape
    constants = _constants(preset, fmt_a, prepared.fmt, constants)
    schedule = Schedule(*(int(v) for v in schedule))
    tasks = offset_tasks(M, prepared.val.shape[0], K, threads.num_threads())
    _run(offset_prepared_task, tasks, K, pack_a(a_codes, fmt_a), prepared.operand, K, schedule, constants, masks,
         out)


def accumulate_offset(a_codes, b_codes, fmt_a, fmt_b, preset, schedule, params, out, constants=None, masks=MASKS):
    """:func:`mmaemu.cpu.engine.accumulate_fast`'s interface on the offset engine (``params``, the preset's
    :class:`~mmaemu.arith.params.BlockParams`, is implied by the preset and the formats), the same bits as
    :func:`prepare_b` then :func:`accumulate_prepared`. Where one range of rows takes all of A
    (:func:`offset_tasks`), each task packs its own panels of B as it goes (B is read once, from the codes);
    otherwise B is prepared first, in parallel, and every range of rows reads the prepared panels."""
    M, K = a_codes.shape
    N = b_codes.shape[0]
    panels = max(1, -(-N // PANEL))
    tasks = offset_tasks(M, panels, K, threads.num_threads())
    if any(m_hi - m_lo != M for _, _, m_lo, m_hi in tasks):
        accumulate_prepared(a_codes, prepare_b(b_codes, fmt_b), fmt_a, preset, schedule, out, constants, masks)
        return
    constants = _constants(preset, fmt_a, fmt_b, constants)
    schedule = Schedule(*(int(v) for v in schedule))
    _run(offset_codes_task, tasks, K, pack_a(a_codes, fmt_a), np.ascontiguousarray(b_codes, dtype=np.uint8),
         code_decode(fmt_b), K, schedule, constants, masks, out)

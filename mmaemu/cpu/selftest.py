"""The self-test the AVX2 offset engine passes in a process before it computes anything there.

On a CPU without AVX-512 the offset engine's FMA rounds toward zero only because the thread's MXCSR is set to
round toward zero around the block steps (:mod:`mmaemu.cpu.simd`). That holds when the compiler keeps every
floating-point operation of a region between its two ``ldmxcsr``: LLVM orders memory operations around
``llvm.x86.sse.ldmxcsr`` but may move pure floating-point operations across it, and mmaemu accepts numba >= 0.59
(LLVM 14 and later), so the same source could give other bits with another LLVM. The engine is therefore used in a
process only after :func:`run_offset_selftest` has shown that it computes the arithmetic there: a few adversarial
GEMMs (:data:`SELFTEST_CASES`: hopper fast and slow, ada fast and slow, contiguous and pairwise split-K, E5M2 on
either side; the row families of :func:`adversarial_rows`: products below the block grid, which an FMA rounding
to nearest (one outside its region) would round up, and inexact fp32 chain sums, which round otherwise when MXCSR
is not restored after a region; tests/test_offset_selftest.py shows a kernel with a broken mask and a kernel run
toward zero throughout failing it) compared bit for bit with the tile engine
(:mod:`mmaemu.arith.tile`, which rounds by integer arithmetic and needs no special rounding), and the calling
thread's MXCSR unchanged after the kernel returns (called directly, without the restoring wrapper of the tasks).

The verdict (:class:`OffsetSelftest`) is computed on first use (:func:`mmaemu.cpu.engine.offset_selftest`, never at
import, never on an AVX-512 target, never for a call the tile engine computes anyway) and kept in memory for the
process, not on disk (:func:`process_verdict`). Decisions read it through their context's ``cpu_selftest`` source
(:func:`mmaemu.cpu.engine.selftest_of`; :mod:`mmaemu.context`), so a test gives them another verdict without
patching a module.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, NamedTuple, Optional

import numpy as np

from .. import formats

#: Largest finite magnitude, smallest subnormal and a mid-range normal code of each format (positive codes).
EXTREMES = {"e4m3": (0x7E, 0x01, 0x08), "e5m2": (0x7B, 0x01, 0x04)}


class OffsetSelftest(NamedTuple):
    """The verdict on the AVX2 offset engine in this process: ``passed``, ``reason`` (what failed, in words; empty
    when passed) and ``seconds`` (the self-test's wall time, compilation included)."""

    passed: bool
    reason: str
    seconds: float


class SelftestCase(NamedTuple):
    """One GEMM of the self-test: K, then the arguments of :func:`mmaemu.cpu.engine.accumulate_codes` in its order
    (formats, the preset's name, fast accumulation, split-K)."""

    K: int
    fmt_a: str
    fmt_b: str
    preset: str
    fast: bool
    splits: int
    scheme: str

    @property
    def label(self) -> str:
        split = "" if self.splits == 1 else f" {self.scheme} S={self.splits}"
        return (f"{self.preset} {'fast' if self.fast else 'slow'}{split} {self.fmt_a} x {self.fmt_b}, "
                f"K={self.K}")


SELFTEST_CASES = (
    SelftestCase(300, "e4m3", "e4m3", "hopper", True, 1, "none"),
    SelftestCase(300, "e4m3", "e5m2", "hopper", False, 1, "none"),
    SelftestCase(129, "e5m2", "e4m3", "ada", True, 1, "none"),
    SelftestCase(300, "e5m2", "e5m2", "ada", False, 1, "none"),
    SelftestCase(300, "e4m3", "e4m3", "hopper", False, 5, "contiguous"),
    SelftestCase(300, "e4m3", "e5m2", "ada", False, 5, "pairwise"),
)
# MXCSR's control bits (DAZ, the exception masks, rounding control, FZ: bits 6-15, Intel SDM vol. 1, 10.2.3); bits
# 0-5 are sticky exception flags that any floating-point operation may set, so they are not compared.
MXCSR_CONTROL = 0xFFC0
# Rows of A and B beyond the adversarial ones: B gets 71 rows in all, a whole panel of 64 columns and a ragged one.
EXTRA_ROWS_A, EXTRA_ROWS_B = 2, 63


def adversarial_rows(fmt: str, K: int) -> np.ndarray:
    """Rows that defeat each step of the offset method: one huge product among tiny ones, cancellation to +0, a
    sum that grows through the blocks (its grid coarsens), subnormals only with mixed signs, only +-0, a late
    first product, grid-edge significands (odd significands next to the largest magnitude, so that products
    sit one unit either side of the block grid), and large magnitudes in the first 128 k then negative subnormals
    (chains of a slow or split schedule whose fp32 sums are inexact: they round as the thread's MXCSR says).
    uint8 [8, K], finite codes only."""
    big, tiny, norm = EXTREMES[fmt]
    rows = np.zeros((8, K), np.uint8)
    rows[0, 0], rows[0, 1:32] = big, tiny
    rows[1, 0], rows[1, 1:2], rows[1, 2:3] = big, big ^ 0x80, tiny
    rows[2], rows[2, ::7] = norm, big - 2
    rows[3], rows[3, ::2] = tiny, tiny | 0x80
    rows[4, ::5] = 0x80
    rows[5, min(129, K - 1)] = big
    rows[6] = [(big - 1 - (k % 3)) | (0x80 * (k % 2)) for k in range(K)]
    rows[6, 1::9] = tiny
    k = np.arange(K)
    rows[7] = np.where(k < 128, big - k % 4, (tiny + k % 3) | 0x80)
    return rows


def case_operands(case: SelftestCase, seed: int):
    """(A [10, K], B [71, K]) uint8 codes of a case: the adversarial rows, then random finite codes (a spread of
    2.5 binades around 2.0, subnormals included)."""
    rng = np.random.default_rng(seed)
    a = np.concatenate([adversarial_rows(case.fmt_a, case.K),
                        formats.random_codes(rng, (EXTRA_ROWS_A, case.K), case.fmt_a, spread=2.5, centre=1)])
    b = np.concatenate([adversarial_rows(case.fmt_b, case.K),
                        formats.random_codes(rng, (EXTRA_ROWS_B, case.K), case.fmt_b, spread=2.5, centre=1)])
    return a, b


def offset_accumulators(a, b, fmt_a, fmt_b, preset, schedule, params):
    """fp32 accumulators [M, N] of the offset engine (:func:`mmaemu.cpu.offset_engine.accumulate_offset`)."""
    from .offset_engine import accumulate_offset

    out = np.zeros((a.shape[0], b.shape[0]), np.float32)
    accumulate_offset(a, b, fmt_a, fmt_b, preset, schedule, params, out)
    return out


def direct_offset(a, b, fmt_a, fmt_b, preset, schedule):
    """fp32 accumulators [M, N] of the offset kernel (:func:`mmaemu.cpu.offset_kernel.offset_panel_rows`) called
    directly on the calling thread, panel by panel, without the restoring wrapper of the engine's tasks."""
    from ..arith.offset import ADD_MAX, offset_params
    from ..arith.params import Schedule, preset_params
    from .offset_engine import pack_a, prepare_b
    from .offset_kernel import MASKS, PANEL, offset_panel_rows, panel_of

    prepared, packed_a = prepare_b(b, fmt_b), pack_a(a, fmt_a)
    constants = offset_params(preset_params(preset, fmt_a, fmt_b), fmt_a, fmt_b, ADD_MAX)
    schedule = Schedule(*(int(v) for v in schedule))
    out = np.zeros((a.shape[0], b.shape[0]), np.float32)
    for p in range(prepared.val.shape[0]):
        offset_panel_rows(0, a.shape[0], packed_a, panel_of(prepared.operand, p), p * PANEL, a.shape[1], schedule,
                          constants, MASKS, out)
    return out


def kernel_mxcsr_change(a, b, fmt_a, fmt_b, preset, schedule):
    """(MXCSR before, MXCSR after) of the calling thread (:data:`MXCSR_CONTROL` is compared) around
    :func:`direct_offset`: a kernel that leaves a region with the wrong MXCSR shows here. The thread's MXCSR is
    put back in any case."""
    from .simd import set_thread_mxcsr, thread_mxcsr

    before = thread_mxcsr()
    try:
        direct_offset(a, b, fmt_a, fmt_b, preset, schedule)
    finally:
        after = thread_mxcsr()
        if after != before:  # never leave the caller's thread changed, whatever the verdict
            set_thread_mxcsr(before)
    return int(before), int(after)


def _first_failure(tile: Callable, offset: Callable, mxcsr_change: Callable) -> Optional[str]:
    from ..arith.params import codes_gemm
    from ..model.presets import get_preset

    for seed, case in enumerate(SELFTEST_CASES):
        a, b = case_operands(case, seed)
        preset = get_preset(case.preset, warn=False)
        gemm = codes_gemm(a, b, case.fmt_a, case.fmt_b, preset, case.fast, case.splits, case.scheme)
        want = np.asarray(tile(a, b, case.fmt_a, case.fmt_b, preset, case.fast, case.splits, case.scheme),
                          np.float32).view(np.uint32)
        got = np.asarray(offset(gemm.a_codes, gemm.b_codes, case.fmt_a, case.fmt_b, preset, gemm.schedule,
                                gemm.params), np.float32).view(np.uint32)
        bad = np.argwhere(got != want)
        if len(bad):
            m, n = (int(i) for i in bad[0])
            return (f"{case.label}: {len(bad)} of {want.size} accumulators differ from the tile "
                    f"engine's, first [{m}, {n}]: {int(got[m, n]):#010x} instead of {int(want[m, n]):#010x}")
    case = SELFTEST_CASES[0]
    a, b = case_operands(case, 0)
    preset = get_preset(case.preset, warn=False)
    gemm = codes_gemm(a, b, case.fmt_a, case.fmt_b, preset, case.fast, case.splits, case.scheme)
    before, after = mxcsr_change(gemm.a_codes, gemm.b_codes, case.fmt_a, case.fmt_b, preset, gemm.schedule)
    if (before ^ after) & MXCSR_CONTROL:
        return f"the kernel left the thread's MXCSR at {after:#06x}, it was {before:#06x}"
    return None


def run_offset_selftest(tile: Callable, offset: Callable = offset_accumulators,
                        mxcsr_change: Callable = kernel_mxcsr_change) -> OffsetSelftest:
    """Run the self-test now (see the module docstring). ``tile(a, b, fmt_a, fmt_b, preset, fast, splits,
    scheme)`` gives the tile engine's accumulators (:func:`mmaemu.cpu.engine.accumulate_codes` with
    ``cpu_engine="tile"``), ``offset(a, b, fmt_a, fmt_b, preset, schedule, params)`` those under test and
    ``mxcsr_change(a, b, fmt_a, fmt_b, preset, schedule)`` the thread's MXCSR before and after one kernel call
    (tests pass wrong ones to show that the self-test fails). A self-test that raises fails with the exception's
    text."""
    start = time.perf_counter()
    try:
        why = _first_failure(tile, offset, mxcsr_change)
    except Exception as exc:  # a compilation or run failure is a failed self-test, never a crash of the call
        why = "it raised " + " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return OffsetSelftest(why is None, why or "", time.perf_counter() - start)


_lock = threading.Lock()
_VERDICT = []  # the process's verdict once computed: [OffsetSelftest]


def process_verdict(run: Callable[[], OffsetSelftest]) -> OffsetSelftest:
    """The process's verdict on the AVX2 offset engine: ``run()`` on the first call (:func:`run_offset_selftest`,
    :func:`mmaemu.cpu.engine.offset_selftest` gives it the tile engine), the same answer afterwards (kept in
    memory only)."""
    with _lock:
        if not _VERDICT:
            _VERDICT.append(run())
        return _VERDICT[0]

"""Which CPU engine computes a call: the offset engine (:mod:`.offset_engine`) where the CPU Numba compiles for
has AVX-512, or AVX2 and FMA, and the call fits the method, the tile engine (:mod:`mmaemu.arith.tile`) everywhere
else.

The decision is :func:`choose_cpu_engine`, a pure function of the request (``MMAEMU_CPU_ENGINE``: auto, offset or
tile), the target CPU and the call's own decline reason (:func:`offset_call_decline`: preset, schedule, formats); it
returns the engine and why. The target CPU is the one Numba really compiles for (:func:`numba_target`):
``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` when set (with ``NUMBA_CPU_NAME=generic`` Numba adds no feature at
all), the host's otherwise, with ``NUMBA_ENABLE_AVX=0``
clearing every AVX feature, as :mod:`numba.core.codegen` does. The offset engine needs a vector FMA that rounds
toward zero (:func:`offset_rounding`): AVX-512's embedded rounding (its vectors also use 16-bit lane maxima, BW,
and masks of 16 lanes, F, VL, DQ in LLVM's lowering, so it asks for AVX-512 F, BW, DQ and VL), or, on AVX2 with
FMA, the plain FMA with the thread's MXCSR set to round toward zero around the kernel's block steps
(:mod:`mmaemu.cpu.simd`). Nothing of the offset engine is compiled unless one of them is present. With MXCSR
rounding the engine computes only after its self-test passed in the process (:mod:`mmaemu.cpu.selftest`, a verdict
given to :func:`choose_cpu_engine` as a source); otherwise ``auto`` takes the tile engine and says why.
"""

from __future__ import annotations

import functools
import platform
from typing import Any, Callable, NamedTuple, Optional

from ..arith.offset import offset_preset_decline
from ..arith.params import Schedule, preset_params
from ..errors import BackendFallbackWarning, BackendUnavailableError
from ..warn import Notice

CPU_ENGINE_ENV = "MMAEMU_CPU_ENGINE"
REQUIRED_FEATURES = ("avx512f", "avx512bw", "avx512dq", "avx512vl")
AVX2_FEATURES = ("avx2", "fma")  # the "mxcsr" rounding: 256-bit integer vectors and a hardware FMA
#: How the offset engine's FMA rounds toward zero (:func:`offset_rounding`).
ROUNDING_EMBEDDED = "embedded"
ROUNDING_MXCSR = "mxcsr"
# The byte counters hold nfma / 4 products each and their sum is taken by one multiply (offset_kernel docstring).
MAX_NFMA = 255


class TargetCpu(NamedTuple):
    """The CPU Numba compiles for: its LLVM name, the features it enables, the machine's architecture."""

    name: str
    features: frozenset
    machine: str


class EngineChoice(NamedTuple):
    """The CPU engine of a call ("offset" or "tile"), why, and the warnings of the choice (:class:`Notice`)."""

    engine: str
    reason: str
    notices: tuple = ()


def parse_features(text: str) -> frozenset:
    """The enabled features of an LLVM feature string ("+avx512f,-avx512fp16,...")."""
    items = (item.strip() for item in text.split(","))
    return frozenset(item[1:] for item in items if item.startswith("+"))


@functools.lru_cache(maxsize=None)
def numba_target() -> TargetCpu:
    """The target of Numba's CPU JIT in this process (read from numba's configuration as its codegen reads it)."""
    import llvmlite.binding as ll
    from numba.core import config
    from numba.core.codegen import get_host_cpu_features

    name = config.CPU_NAME or ll.get_host_cpu_name()
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features()
    return TargetCpu(str(name), parse_features(features or ""), platform.machine().lower())


def offset_rounding(target: TargetCpu) -> Optional[str]:
    """How the offset engine's FMA rounds toward zero on ``target``: :data:`ROUNDING_EMBEDDED` (AVX-512 F/BW/DQ/VL:
    per instruction), :data:`ROUNDING_MXCSR` (AVX2 and FMA: the thread's MXCSR set around the block steps), None
    where neither is available."""
    if target.machine not in ("x86_64", "amd64"):
        return None
    if all(f in target.features for f in REQUIRED_FEATURES):
        return ROUNDING_EMBEDDED
    if all(f in target.features for f in AVX2_FEATURES):
        return ROUNDING_MXCSR
    return None


def offset_engine_decline(target: TargetCpu) -> Optional[str]:
    """Why the offset engine cannot run on this target (None if it can: :func:`offset_rounding`)."""
    if target.machine not in ("x86_64", "amd64"):
        return f"needs an x86-64 CPU with AVX-512 or AVX2 and FMA (this is {target.machine})"
    if offset_rounding(target) is None:
        missing = [f for f in AVX2_FEATURES if f not in target.features]
        return (f"needs AVX-512 F/BW/DQ/VL (embedded rounding) or AVX2 and FMA (MXCSR rounding) for its "
                f"round-toward-zero vector FMA; the target Numba compiles for ({target.name}) lacks "
                f"{', '.join(missing)}")
    return None


class OffsetShapes(NamedTuple):
    """The results on which ``auto`` takes the offset engine: rows min_rows ... max_rows (None: no upper bound) and
    at least min_columns columns, or (where narrow_min_rows is not None) at least narrow_min_rows rows and at most
    max_rows, whatever the columns."""

    min_rows: int
    max_rows: Optional[int]
    min_columns: int
    narrow_min_rows: Optional[int] = None


# Where "auto" takes the offset engine, per rounding: the shapes on which it measured faster than the tile engine
# (both give the same bits). AVX-512 (docs/performance.md, "The offset engine against the prototype", 7 Dec 2026,
# this project's 2-core Zen 4, hopper fast, 1 and 2 threads): offset / tile 1.5-1.6x at (2048, 5760, 1920), 1.6-1.9x
# at (256, 256, 4096), 0.68x at (8, 5760, 1920) before its panel decode was made faster (about even after); earlier
# ("Two engines", 2 Dec 2026) 1.08-1.68x for rows 16 to 512, N = 16: 0.18-0.27x. After A's tile-major packing
# and the inlined block step ("The offset engine against the prototype", N = 5760, K = 1920, load average about 5,
# 1 and 2 threads, two runs): 1.30-1.47x at M = 8, 1.52-1.67x at M = 12, 0.85-1.08x at M = 4, 0.73-0.80x at M = 2,
# hence the offset engine from M = 8 on AVX-512. AVX2 with MXCSR rounding
# ("The offset engine on AVX2", 7 Dec 2026, a 2-core Zen 3 without AVX-512, one thread): 1.25-1.52x for
# 16 <= M <= 512, 0.73x at M = 2048, 0.83-0.90x at M = 1, 0.26x at N = 16. From N = 64 on AVX-512 ("The decoder's
# prefill around the kernel", 7 Dec 2026, kept weight, whole call, 2 threads): 2.9x at (64, 192, 576), 2.2-2.4x
# at N = 64 and 128, 1.04x at (8, 64, 576), 1.5-2.0x at N = 16 and 32 with M = 64, 0.97x at (8, 32, 576). Narrow
# results from M = 16 ("Narrow results on the offset engine", 7 Dec 2026, accumulate_codes, 2 threads, load 2.7):
# 1.35-1.50x at (16, 16, 576), 1.6-1.9x at (64, 16 and 32, 576), 2.7-6.7x at (256, 16, 4096), 3.0-4.0x at
# (1024, 32, 1024); at M = 8 0.93-1.25x, so N >= 64 there.
OFFSET_SHAPES = {ROUNDING_EMBEDDED: OffsetShapes(8, None, 64, 16), ROUNDING_MXCSR: OffsetShapes(16, 512, 384)}


def offset_shape_decline(M: int, N: int, rounding: str = ROUNDING_EMBEDDED) -> Optional[str]:
    """Why ``auto`` keeps the tile engine for an [M, N] result although the offset engine could compute it with
    ``rounding`` (:func:`offset_rounding`; None where the offset engine is the faster one: :data:`OFFSET_SHAPES`)."""
    shapes = OFFSET_SHAPES[rounding]
    if shapes.max_rows is None or M <= shapes.max_rows:
        if shapes.min_rows <= M and N >= shapes.min_columns:
            return None
        if shapes.narrow_min_rows is not None and M >= shapes.narrow_min_rows:
            return None
    return f"is the faster engine for {_shape_words(shapes)} only (docs/performance.md), this call is M = {M}, N = {N}"


def _shape_words(shapes: OffsetShapes) -> str:
    def rows(least: int) -> str:
        return f"M >= {least}" if shapes.max_rows is None else f"{least} <= M <= {shapes.max_rows}"

    words = f"{rows(shapes.min_rows)} rows and N >= {shapes.min_columns} columns"
    if shapes.narrow_min_rows is not None:
        words += f", or {rows(shapes.narrow_min_rows)} rows and any N"
    return words


def choose_cpu_engine(requested: str, target: TargetCpu, call_decline: Optional[str],
                      shape_decline: Optional[str] = None, selftest: Optional[Callable[[], Any]] = None
                      ) -> EngineChoice:
    """The CPU engine for a call: ``requested`` (auto, offset, tile), the target CPU, the call's decline reason
    (:func:`offset_call_decline`, None if the offset method computes it), for ``auto`` only the shape's
    (:func:`offset_shape_decline`: a speed rule, never a correctness one) and, on an MXCSR-rounding target, the
    self-test verdict (``selftest()``: a :class:`mmaemu.cpu.selftest.OffsetSelftest`, asked only when the offset
    engine would compute the call; None: not consulted). Forcing ``offset`` where it cannot run raises ValueError
    naming the rule and the way out, and where it failed its self-test BackendUnavailableError; ``auto`` then takes
    the tile engine with a BackendFallbackWarning (once per process) in the choice's notices."""
    if requested == "tile":
        return EngineChoice("tile", f"{CPU_ENGINE_ENV}=tile")
    cpu_why = offset_engine_decline(target)
    why = cpu_why or call_decline
    if requested == "offset":
        if why is not None:
            raise ValueError(f"{CPU_ENGINE_ENV}=offset: the offset engine {why}; unset {CPU_ENGINE_ENV} (or set it "
                             "to auto or tile) to use the tile engine")
        failed = _selftest_failure(target, selftest)
        if failed is not None:
            raise BackendUnavailableError(f"{CPU_ENGINE_ENV}=offset: {failed}; set {CPU_ENGINE_ENV}=tile (or "
                                          "auto) to use the tile engine")
        return EngineChoice("offset", f"{CPU_ENGINE_ENV}=offset, {_rounding_words(target)}")
    if why is not None:
        return EngineChoice("tile", f"the offset engine {why}")
    if shape_decline is not None:
        return EngineChoice("tile", f"the offset engine {shape_decline}; {CPU_ENGINE_ENV}=offset forces it")
    failed = _selftest_failure(target, selftest)
    if failed is not None:
        return EngineChoice("tile", failed, (selftest_notice(failed),))
    return EngineChoice("offset", f"{_rounding_words(target)}, the call fits the offset method")


def _selftest_failure(target: TargetCpu, selftest) -> Optional[str]:
    """Why the offset engine may not compute on ``target`` by its self-test (None: it passed, or the target rounds
    by AVX-512's embedded rounding, or no verdict source was given)."""
    if selftest is None or offset_rounding(target) != ROUNDING_MXCSR:
        return None
    verdict = selftest()
    return None if verdict.passed else f"the AVX2 offset engine failed its self-test ({verdict.reason})"


def selftest_notice(failed: str) -> Notice:
    """The warning of a failed self-test under ``auto``: once per process."""
    return Notice(BackendFallbackWarning, f"mmaemu: {failed}; the cpu backend computes with the tile engine "
                                          f"(same bits, slower). {CPU_ENGINE_ENV}=tile silences this warning",
                  ("cpu engine self-test",))


def _rounding_words(target: TargetCpu) -> str:
    """How the offset engine rounds on ``target``, in words (for the reasons of a choice)."""
    if offset_rounding(target) == ROUNDING_EMBEDDED:
        return f"AVX-512 F/BW/DQ/VL on {target.name}"
    return f"AVX2 and FMA on {target.name}, rounding toward zero by MXCSR around the block steps"



def engine_summary(requested: str, target: TargetCpu, selftest: Optional[Callable[[], Any]] = None) -> str:
    """One line for ``mmaemu info``: which engine the cpu backend runs here and why (no call needed; on an
    MXCSR-rounding target the self-test verdict ``selftest()`` is asked, as :func:`choose_cpu_engine` asks it)."""
    if requested == "tile":
        return f"engine: tile ({CPU_ENGINE_ENV}=tile)"
    why = offset_engine_decline(target)
    failed = None if why is not None else _selftest_failure(target, selftest)
    if failed is not None:
        if requested == "offset":
            return f"engine: none: {CPU_ENGINE_ENV}=offset, but {failed} (calls raise; set {CPU_ENGINE_ENV}=tile)"
        return f"engine: tile ({failed})"
    if why is not None:
        if requested == "offset":
            return (f"engine: none: {CPU_ENGINE_ENV}=offset, but the offset engine {why} (calls raise; unset "
                    f"{CPU_ENGINE_ENV} for the tile engine)")
        return f"engine: tile (the offset engine {why})"
    return (f"engine: offset ({_rounding_words(target)}) for the calls the offset method fits (hopper, "
            f"ada: fast and slow, every split scheme, every FP8 pair) with "
            f"{_shape_words(OFFSET_SHAPES[offset_rounding(target)])} (where it is the faster one), tile for the "
            f"others")


def offset_call_decline(preset, schedule, fmt_a: str, fmt_b: str) -> Optional[str]:
    """Why the offset engine does not compute a call (None if it does): the method's conditions
    (:func:`mmaemu.arith.offset.offset_preset_decline`: early-accumulator presets whose block sums fit the
    window, frac_out >= frac, nfma a multiple of 16, a min_exp whose offset stays finite), nfma <= MAX_NFMA (the
    byte counters), and k-tiles that whole blocks fill (split or slow schedules: nfma divides the tile, so no block ends inside a tile before K)."""
    params = preset_params(preset, fmt_a, fmt_b)
    nfma = params.nfma
    why = offset_preset_decline(params)
    if why is not None:
        return why
    if nfma > MAX_NFMA:
        return f"counts corrections in bytes, which needs nfma <= {MAX_NFMA} (nfma={nfma})"
    schedule = Schedule(*(int(v) for v in schedule))
    if (schedule.splits > 1 or schedule.chain_tiles) and schedule.tile % nfma:
        return f"needs k-tiles of whole blocks, the schedule's tiles are {schedule.tile} wide and nfma={nfma}"
    return None

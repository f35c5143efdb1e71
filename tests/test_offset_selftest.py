"""The AVX2 offset engine (MXCSR rounding) computes only after its self-test passed in the process
(mmaemu.cpu.selftest): the self-test passes here and leaves the thread's MXCSR as it was; a wrong kernel (the
compiled offset kernel with a broken mask) or a kernel that leaves MXCSR changed fails it; a failed verdict, given
through the context's cpu_selftest source, makes auto take the tile engine with the reason and one warning per
process, and a forced MMAEMU_CPU_ENGINE=offset raise naming the self-test and the way out; the verdict is never
asked on an AVX-512 target, for a tile choice or for a call the offset method declines."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from mmaemu import environment, warn
from mmaemu.context import Context
from mmaemu.cpu import engine, features, selftest
from mmaemu.cpu.selftest import OffsetSelftest, run_offset_selftest
from mmaemu.errors import BackendFallbackWarning, BackendUnavailableError

from test_offset_engine import HASWELL, MASK_MUTATIONS, ZEN4

MXCSR_TARGET = features.offset_rounding(features.numba_target()) == features.ROUNDING_MXCSR
needs_mxcsr = pytest.mark.skipif(not MXCSR_TARGET, reason="the target CPU rounds the offset engine's FMA by AVX-512 "
                                                          "embedded rounding or has no offset engine")
FAILED = OffsetSelftest(False, "hopper fast e4m3 x e4m3, K=300: 3 of 710 accumulators differ (injected)", 0.0)


def _never_asked():
    raise AssertionError("the self-test verdict was asked")


@needs_mxcsr
def test_the_selftest_passes_and_leaves_mxcsr_as_it_was():
    from mmaemu.cpu.simd import thread_mxcsr

    before = thread_mxcsr()
    verdict = run_offset_selftest(engine._tile_accumulators)
    assert verdict == (True, "", verdict.seconds) and verdict.seconds > 0
    assert (thread_mxcsr() ^ before) & selftest.MXCSR_CONTROL == 0
    assert engine.offset_selftest() is engine.offset_selftest()  # once per process
    assert engine.offset_selftest().passed


def _broken_mask_offset(a, b, fmt_a, fmt_b, preset, schedule, params):
    """The compiled offset kernel with the byte-sum mask cut (a miscompiled kernel's stand-in)."""
    from mmaemu.cpu.offset_engine import accumulate_prepared, prepare_b
    from mmaemu.cpu.offset_kernel import MASKS

    masks = list(MASKS)
    index, value = MASK_MUTATIONS[0]
    masks[index] = value
    out = np.zeros((a.shape[0], b.shape[0]), np.float32)
    accumulate_prepared(a, prepare_b(b, fmt_b), fmt_a, preset, schedule, out, None, type(MASKS)(*masks))
    return out


@needs_mxcsr
def test_a_wrong_kernel_fails_the_selftest():
    verdict = run_offset_selftest(engine._tile_accumulators, offset=_broken_mask_offset)
    assert not verdict.passed
    assert verdict.reason.startswith("hopper fast e4m3 x e4m3, K=300: ") and "differ from the tile engine" in \
        verdict.reason


@needs_mxcsr
def test_a_kernel_that_leaves_mxcsr_changed_fails_the_selftest():
    verdict = run_offset_selftest(engine._tile_accumulators, mxcsr_change=lambda *args: (0x1F80, 0x7F80))
    assert verdict == (False, "the kernel left the thread's MXCSR at 0x7f80, it was 0x1f80", verdict.seconds)
    flags_only = run_offset_selftest(engine._tile_accumulators, mxcsr_change=lambda *args: (0x1F80, 0x1FA2))
    assert flags_only.passed  # sticky exception flags are no control bits


def test_a_selftest_that_raises_fails():
    def raising(*args):
        raise RuntimeError("no\nkernel")

    verdict = run_offset_selftest(raising)
    assert verdict == (False, "it raised RuntimeError: no kernel", verdict.seconds)


def test_a_failed_verdict_makes_auto_take_the_tile_engine_and_forced_offset_raise():
    choice = features.choose_cpu_engine("auto", HASWELL, None, None, lambda: FAILED)
    assert choice.engine == "tile"
    assert choice.reason == f"the AVX2 offset engine failed its self-test ({FAILED.reason})"
    (notice,) = choice.notices
    assert notice.category is BackendFallbackWarning and choice.reason in notice.message
    assert "MMAEMU_CPU_ENGINE=tile" in notice.message
    with pytest.raises(BackendUnavailableError, match=r"MMAEMU_CPU_ENGINE=offset: the AVX2 offset engine failed "
                                                      r"its self-test .*set MMAEMU_CPU_ENGINE=tile"):
        features.choose_cpu_engine("offset", HASWELL, None, None, lambda: FAILED)
    passing = lambda: OffsetSelftest(True, "", 0.1)  # noqa: E731
    assert features.choose_cpu_engine("auto", HASWELL, None, None, passing) == (
        "offset", "AVX2 and FMA on haswell, rounding toward zero by MXCSR around the block steps, the call fits the "
                  "offset method", ())
    assert features.choose_cpu_engine("offset", HASWELL, None, None, passing).engine == "offset"


def test_the_verdict_is_asked_only_where_the_mxcsr_engine_would_compute():
    assert features.choose_cpu_engine("auto", ZEN4, None, None, _never_asked).engine == "offset"
    assert features.choose_cpu_engine("offset", ZEN4, None, None, _never_asked).engine == "offset"
    assert features.choose_cpu_engine("tile", HASWELL, None, None, _never_asked).engine == "tile"
    assert features.choose_cpu_engine("auto", HASWELL, "needs x", None, _never_asked).engine == "tile"
    assert features.choose_cpu_engine("auto", HASWELL, None, "is faster elsewhere", _never_asked).engine == "tile"
    assert "engine: offset" in features.engine_summary("auto", ZEN4, _never_asked)
    assert features.engine_summary("tile", HASWELL, _never_asked) == "engine: tile (MMAEMU_CPU_ENGINE=tile)"


def test_info_reports_the_failed_selftest():
    assert features.engine_summary("auto", HASWELL, lambda: FAILED) == (
        f"engine: tile (the AVX2 offset engine failed its self-test ({FAILED.reason}))")
    assert "calls raise; set MMAEMU_CPU_ENGINE=tile" in features.engine_summary("offset", HASWELL, lambda: FAILED)


def _plan(context):
    from mmaemu.plan.planner import plan_scaled_mm

    g = torch.Generator().manual_seed(3)
    a = (torch.randn(64, 64, generator=g) * 8).to(torch.float8_e4m3fn)
    b = (torch.randn(512, 64, generator=g) * 8).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    return plan_scaled_mm(a, b.t(), one, one, out_dtype=torch.float32, profile="hopper", splitk=1,
                          context=context)


@needs_mxcsr
def test_the_plan_falls_back_with_the_reason_and_warns_once_per_process(monkeypatch):
    monkeypatch.setattr(warn, "_emitted", set())  # a fresh once-per-process registry
    failing = Context(environment.snapshot({}), cpu_selftest=lambda: FAILED)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with warn.edge():
            plan = _plan(failing)
        with warn.edge():
            _plan(failing)
    assert plan.describe().cpu_engine == f"tile: the AVX2 offset engine failed its self-test ({FAILED.reason})"
    fallbacks = [w for w in caught if issubclass(w.category, BackendFallbackWarning)]
    assert len(fallbacks) == 1 and FAILED.reason in str(fallbacks[0].message)
    forced = Context(environment.snapshot({"MMAEMU_CPU_ENGINE": "offset"}), cpu_selftest=lambda: FAILED)
    with pytest.raises(BackendUnavailableError, match="failed its self-test"):
        _plan(forced)
    passing = Context(environment.snapshot({}), cpu_selftest=lambda: OffsetSelftest(True, "", 0.0))
    assert _plan(passing).describe().cpu_engine.startswith("offset: AVX2 and FMA")


@needs_mxcsr
def test_a_kernel_whose_operations_all_round_toward_zero_fails_the_selftest():
    """The offset kernel run with the thread's MXCSR already rounding toward zero: the operations outside its regions
    (split combinations, chain sums) then round toward zero too, as after a missing restore of MXCSR."""
    from mmaemu.cpu.simd import set_thread_mxcsr, thread_mxcsr

    def toward_zero_throughout(a, b, fmt_a, fmt_b, preset, schedule, params):
        saved = thread_mxcsr()
        set_thread_mxcsr(saved | 0x6000)
        try:
            return selftest.direct_offset(a, b, fmt_a, fmt_b, preset, schedule)
        finally:
            set_thread_mxcsr(saved)

    def direct(a, b, fmt_a, fmt_b, preset, schedule, params):
        return selftest.direct_offset(a, b, fmt_a, fmt_b, preset, schedule)

    assert run_offset_selftest(engine._tile_accumulators, offset=direct).passed
    verdict = run_offset_selftest(engine._tile_accumulators, offset=toward_zero_throughout)
    assert not verdict.passed and "differ from the tile engine" in verdict.reason, verdict


LAZY_RUN = """
import numpy as np
from mmaemu import formats
from mmaemu.cpu import features, selftest
from mmaemu.cpu.engine import accumulate_codes
from mmaemu.model.presets import HOPPER

assert features.offset_rounding(features.numba_target()) == features.ROUNDING_MXCSR
assert not selftest._VERDICT, "the self-test ran at import"
rng = np.random.default_rng(5)
a, b = formats.random_codes(rng, (64, 64), "e4m3"), formats.random_codes(rng, (512, 64), "e4m3")
accumulate_codes(a, b, "e4m3", "e4m3", HOPPER, True, cpu_engine="tile")
accumulate_codes(a[:1], b, "e4m3", "e4m3", HOPPER, True)  # auto, one row: the tile engine by the shape rule
assert not selftest._VERDICT, "the self-test ran for a call the tile engine computes"
accumulate_codes(a, b, "e4m3", "e4m3", HOPPER, True)  # auto, 64 x 512: the offset engine, after its self-test
print(len(selftest._VERDICT), selftest._VERDICT[0].passed)
"""


@pytest.mark.subprocess
@pytest.mark.slow
def test_the_selftest_runs_on_the_first_offset_call_only(tmp_path):
    """NUMBA_CPU_NAME=haswell (AVX2 and FMA: MXCSR rounding, on an AVX-512 machine too), a fresh process: importing
    runs no self-test, nor do a forced tile call and an auto call that the shape rule gives the tile engine; the
    first auto call that takes the offset engine runs it once, and it passes."""
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="+avx,+avx2,+fma,+f16c,+popcnt,+sse4.2",
               MMAEMU_CACHE_DIR=str(tmp_path))
    env.pop("MMAEMU_CPU_ENGINE", None)
    run = subprocess.run([sys.executable, "-c", LAZY_RUN], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["1", "True"]

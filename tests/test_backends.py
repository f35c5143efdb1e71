"""Backend selection on a machine without a GPU: rules, environment variables, errors and warnings, status and
self-test reports, verdict caching (with a fake device whose self-tests are stubbed), and the device checks of
scripts/gpu_check.py without a device."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch

import mmaemu
from mmaemu import backends
from mmaemu.context import for_call
from mmaemu.errors import BackendFallbackWarning, BackendUnavailableError
from mmaemu.model.presets import Preset, get_preset

ROOT = pathlib.Path(__file__).resolve().parent.parent
HOPPER = get_preset("hopper", warn=False)
CUDA0 = torch.device("cuda", 0)
CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("fresh_dispatcher", "fresh_warnings")  # tests/conftest.py


def _no_warnings():
    return warnings.catch_warnings(record=True)


# ----------------------------------------------------------------------------------------------------------------
# Import hygiene


@pytest.mark.subprocess
def test_import_backends_and_cuda_package_initialise_nothing():
    code = ("import sys, torch; import mmaemu, mmaemu.backends, mmaemu.cuda; "
            "mmaemu.backends.select(torch.device('cpu'), 'auto', 'e4m3', 'e4m3', mmaemu.get_preset('hopper')); "
            "print('numba.cuda' in sys.modules, torch.cuda.is_initialized())")
    out = subprocess.check_output([sys.executable, "-c", code], text=True, cwd=str(ROOT),
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}).split()
    assert out == ["False", "False"]


# ----------------------------------------------------------------------------------------------------------------
# Rules on CPU tensors


def test_cpu_tensors_select_cpu_engines_and_refuse_cuda():
    with _no_warnings() as caught:
        warnings.simplefilter("always")
        auto = backends.select(CPU, "auto", "e4m3", "e4m3", HOPPER)
        assert auto == backends.Selection("cpu", ["cuda: tensors on cpu"])
        assert backends.select(CPU, "cpu", "e4m3", "e5m2", HOPPER) == backends.Selection("cpu", [])
        assert backends.select(CPU, "reference", "e5m2", "e5m2", HOPPER) == backends.Selection("reference", [])
    assert not caught  # design skips never warn
    for name in ("cuda", "cuda:offset", "cuda:simple"):
        with pytest.raises(BackendUnavailableError, match="tensors on cpu"):
            backends.select(CPU, name, "e4m3", "e4m3", HOPPER)


def test_backend_names_and_types():
    for bad in ("gpu", "CUDA", "cuda-tiled", ""):
        with pytest.raises(ValueError, match="unknown backend"):
            backends.requested_backend(bad)
    with pytest.raises(TypeError):
        backends.requested_backend(None)
    assert backends.requested_backend("cuda:anything") == "cuda:anything"


def test_mmaemu_backend_env_replaces_auto_only(monkeypatch):
    monkeypatch.setenv("MMAEMU_BACKEND", "reference")
    assert backends.select(CPU, "auto", "e4m3", "e4m3", HOPPER).name == "reference"
    assert backends.select(CPU, "cpu", "e4m3", "e4m3", HOPPER).name == "cpu"
    monkeypatch.setenv("MMAEMU_BACKEND", "cuda")
    with pytest.raises(BackendUnavailableError):
        backends.select(CPU, "auto", "e4m3", "e4m3", HOPPER)
    monkeypatch.setenv("MMAEMU_BACKEND", "nonsense")
    with pytest.raises(ValueError, match="unknown backend"):
        backends.select(CPU, "auto", "e4m3", "e4m3", HOPPER)


def test_disable_cuda_env(monkeypatch):
    monkeypatch.setenv("MMAEMU_DISABLE_CUDA", "yes")
    sel = backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER)
    assert sel == backends.Selection("cpu", ["cuda: disabled by MMAEMU_DISABLE_CUDA"])
    with pytest.raises(BackendUnavailableError, match="MMAEMU_DISABLE_CUDA"):
        backends.select(CUDA0, "cuda:simple", "e4m3", "e4m3", HOPPER)
    status = backends.backends_status()
    assert all(not status[k].available and "MMAEMU_DISABLE_CUDA" in status[k].reason
               for k in ("cuda:offset", "cuda:simple", "cuda:epilogue"))
    results = backends.selftest()
    assert backends.selftest_verdict(results)[0] == "UNAVAILABLE"


def test_api_on_cpu_tensors():
    g = torch.Generator().manual_seed(3)
    a = (torch.randn(16, 32, generator=g) * 30).to(torch.float8_e4m3fn)
    w = (torch.randn(16, 32, generator=g) * 30).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    plan = mmaemu.explain(a, w.t(), one, one, splitk=1)
    assert plan.validation == "ok", plan.validation
    assert (plan.backend, plan.fallbacks) == ("cpu", ["cuda: tensors on cpu"])
    with pytest.raises(BackendUnavailableError):
        mmaemu.scaled_mm(a, w.t(), one, one, splitk=1, backend="cuda:simple")
    with pytest.raises(BackendUnavailableError):
        mmaemu.accumulate(a, w, use_fast_accum=True, splitk=1, backend="cuda")


# ----------------------------------------------------------------------------------------------------------------
# CUDA tensors on this machine (no CUDA): the reasons are reported


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda_warns_once_and_raises_for_explicit():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER)
        second = backends.select(CUDA0, "auto", "e5m2", "e4m3", HOPPER)
    assert first.name == second.name == "cpu"
    assert first.fallbacks == ["cuda: no CUDA device visible to torch"]
    fallback = [w for w in caught if issubclass(w.category, BackendFallbackWarning)]
    assert len(fallback) == 1 and "no CUDA device visible to torch" in str(fallback[0].message)
    assert fallback[0].filename == __file__  # attributed to the caller, not to mmaemu
    with pytest.raises(BackendUnavailableError, match="no CUDA device visible to torch"):
        backends.select(CUDA0, "cuda", "e4m3", "e4m3", HOPPER)
    with pytest.raises(BackendUnavailableError, match="no such CUDA GEMM kernel"):
        backends.select(CUDA0, "cuda:bogus", "e4m3", "e4m3", HOPPER)
    with pytest.raises(BackendUnavailableError, match="no such CUDA GEMM kernel"):
        backends.select(CUDA0, "cuda:epilogue", "e4m3", "e4m3", HOPPER)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_status_and_selftest_on_a_cpu_machine():
    status = backends.backends_status()
    assert list(status) == ["cuda:native", "cuda:offset", "cuda:simple", "cuda:epilogue", "cpu", "reference"]
    for name in ("cuda:native", "cuda:offset", "cuda:simple", "cuda:epilogue"):
        assert not status[name].available and not status[name].validated_here
        assert status[name].reason == "unavailable: no CUDA device visible to torch"
    for name in ("cpu", "reference"):
        assert status[name].available and status[name].validated_here
    results = backends.selftest()
    assert list(results) == ["cuda:native", "cuda:offset", "cuda:simple", "cuda:epilogue"]
    assert all(len(g) == 1 and not g[0].ran and not g[0].passed for g in results.values())
    verdict, reason = backends.selftest_verdict(results)
    assert verdict == "UNAVAILABLE" and reason.startswith("no CUDA device visible to torch")
    assert list(backends.selftest(kernels="cuda:simple,offset")) == ["cuda:simple", "cuda:offset"]
    with pytest.raises(ValueError, match="unknown CUDA kernel"):
        backends.selftest(kernels="v4")


# ----------------------------------------------------------------------------------------------------------------
# A fake device: the dispatcher's decisions, warnings and verdict cache, with stubbed self-tests


@pytest.fixture
def fake_device(monkeypatch):
    """mmaemu.cuda sees one device; ``outcomes[kernel]`` is what its self-test returns (or raises)."""
    from mmaemu.cuda.dispatch import gating
    from mmaemu.cuda.verdicts import store
    from mmaemu.base.device_facts import DeviceFacts

    state = {"outcomes": {}, "runs": [], "info": DeviceFacts(0, "Fake GPU", "GPU-1234", (9, 0), 132, None,
                                                             torch.__version__, None, None, "13.0",
                                                             compiler="numba 0.68 + numba-cuda 0.30")}

    def probe(device=None):
        return state["info"]

    def run(kernel, info):
        state["runs"].append(kernel)
        outcome = state["outcomes"].get(kernel, True)
        if isinstance(outcome, Exception):
            raise outcome
        details = [{"case": "stub", "mismatches": 0 if outcome else 3, "first": []}]
        return outcome, details

    monkeypatch.setattr(gating, "_probe", probe)
    monkeypatch.setattr(store, "_run_on_device", run)
    return state


def test_all_kernels_pass_auto_takes_the_first(fake_device):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER) == backends.Selection("cuda:native", [])
        assert backends.select(CUDA0, "cuda", "e4m3", "e4m3", HOPPER).name == "cuda:native"
        assert backends.select(CUDA0, "cuda:offset", "e4m3", "e4m3", HOPPER).name == "cuda:offset"
        assert backends.select(CUDA0, "cuda:simple", "e4m3", "e4m3", HOPPER).name == "cuda:simple"
    assert not caught
    assert fake_device["runs"] == ["native", "offset", "simple"]  # each self-test ran once


def test_failing_kernel_falls_back_with_one_warning(fake_device):
    fake_device["outcomes"].update(native=False, offset=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sel = backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER)
        again = backends.select(CUDA0, "auto", "e5m2", "e4m3", HOPPER)
    assert sel.name == again.name == "cuda:simple"
    assert len(sel.fallbacks) == 2 and sel.fallbacks[0].startswith("cuda:native: 1 of 1 cases differ")
    assert sel.fallbacks[1].startswith("cuda:offset: 1 of 1 cases differ")
    msgs = [str(w.message) for w in caught if issubclass(w.category, BackendFallbackWarning)]
    assert len(msgs) == 1 and "cuda:simple computes instead" in msgs[0]
    assert "cuda:native" in msgs[0] and "cuda:offset" in msgs[0]
    with pytest.raises(BackendUnavailableError, match="cuda:offset: 1 of 1 cases differ"):
        backends.select(CUDA0, "cuda:offset", "e4m3", "e4m3", HOPPER)


def test_a_fallback_chosen_while_collecting_still_warns_at_the_first_live_selection(fake_device):
    """explain plans inside mmaemu.warn.collecting(): the fallback it finds is not warned, and the cached
    selection still warns the first call that is not collected (once)."""
    fake_device["outcomes"].update(native=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mmaemu.warn.collecting() as collected:
            assert backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER).name == "cuda:offset"
        assert caught == [] and [n.category for n in collected] == [BackendFallbackWarning]
        for _ in range(2):
            assert backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER).name == "cuda:offset"
    assert [str(w.message) for w in caught] == [collected[0].message]
    assert fake_device["runs"] == ["native", "offset"]  # the selection was cached


def test_every_kernel_failing_ends_on_cpu_or_raises(fake_device):
    fake_device["outcomes"].update(native=False, offset=False, simple=RuntimeError("ptxas exploded"))
    with pytest.warns(BackendFallbackWarning, match="cpu computes instead"):
        sel = backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER)
    assert sel.name == "cpu" and len(sel.fallbacks) == 3
    assert "self-test raised RuntimeError: ptxas exploded" in sel.fallbacks[2]
    with pytest.raises(BackendUnavailableError) as info:
        backends.select(CUDA0, "cuda", "e4m3", "e4m3", HOPPER)
    assert "cuda:offset" in str(info.value) and "ptxas exploded" in str(info.value)


def test_force_fail_env_and_design_skips(fake_device, monkeypatch):
    monkeypatch.setenv("MMAEMU_TEST_FORCE_FAIL", "native,offset")
    with pytest.warns(BackendFallbackWarning, match="forced to fail"):
        assert backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER).name == "cuda:simple"
    monkeypatch.delenv("MMAEMU_TEST_FORCE_FAIL")
    wide = Preset("wide", nfma=256, frac=13, frac_out=13, min_exp=-132, late_c=False, slow_chunk=256)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sel = backends.select(CUDA0, "auto", "e4m3", "e4m3", wide)
        late = backends.select(CUDA0, "auto", "e4m3", "e4m3", get_preset("b200_mma_sync", warn=False))
    assert sel.name == "cuda:simple" and len(sel.fallbacks) == 2
    assert sel.fallbacks[0].startswith("cuda:native: computes the blocks of the FP8 MMA instructions it issues")
    assert "nfma=256" in sel.fallbacks[1]
    # b200_mma_sync: the native and offset kernels decline it by design (late add of c); no warning.
    assert late.name == "cuda:simple" and late.fallbacks[0].startswith("cuda:native: computes the blocks")
    assert late.fallbacks[1:] == [
        "cuda:offset: computes the early-accumulator presets (hopper, ada) only, this preset adds c late "
        "(preset 'b200_mma_sync')"]
    assert not [w for w in caught if issubclass(w.category, BackendFallbackWarning)]


def test_forced_failures_of_a_context_key_the_selections_of_the_process_verdicts(fake_device, monkeypatch):
    """A context without a verdict source reads the process's verdicts (run once, kept); its forced failures are
    part of the kept selection's key, and the process environment's value is not read."""
    from mmaemu import environment
    from mmaemu.context import Context

    forced = Context(environment.snapshot({"MMAEMU_TEST_FORCE_FAIL": "native"}))
    plain = Context(environment.snapshot({}))
    monkeypatch.setenv("MMAEMU_TEST_FORCE_FAIL", "native,offset")
    with pytest.warns(BackendFallbackWarning, match="cuda:native: forced to fail"):
        assert backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER, context=forced).name == "cuda:offset"
    assert backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER, context=plain).name == "cuda:native"
    assert backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER, context=forced).name == "cuda:offset"
    assert fake_device["runs"] == ["offset", "native"]  # each self-test ran once, the forced one never


def test_offset_kernel_takes_split_schedules_and_declines_to_the_next_kernel(fake_device, monkeypatch):
    """Every schedule of hopper/ada on the offset kernel; what it declines by design (a late accumulator, a block
    sum its window cannot hold, k-tiles that do not start on its stages) goes to the reference kernel without a
    warning, and its self-test is not run for it."""
    import mmaemu.cuda as cuda_backend
    from mmaemu.cuda.dispatch import engine

    ada = get_preset("ada", warn=False)
    for preset, fast, splits, scheme in ((HOPPER, True, 1, "none"), (HOPPER, False, 1, "none"),
                                         (HOPPER, False, 3, "contiguous"), (ada, True, 4, "serial"),
                                         (ada, False, 5, "pairwise")):
        assert cuda_backend.schedule_skip("offset", preset, "e4m3", "e5m2", fast, splits, scheme) is None
    late = cuda_backend.schedule_skip("offset", get_preset("b200_mma_sync", warn=False), "e4m3", "e4m3", True)
    assert late.startswith("computes the early-accumulator presets")
    wide = Preset("wide-window", nfma=32, frac=20, frac_out=20, min_exp=-132, late_c=False, slow_chunk=128)
    assert "2**22 units" in cuda_backend.design_skip("offset", wide, "e4m3", "e4m3")
    odd = Preset("odd-slow", nfma=16, frac=13, frac_out=13, min_exp=-132, late_c=False, slow_chunk=80)
    assert cuda_backend.schedule_skip("offset", odd, "e4m3", "e4m3", True) is None
    assert "80 wide" in cuda_backend.schedule_skip("offset", odd, "e4m3", "e4m3", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert backends.select(CUDA0, "auto", "e4m3", "e4m3", wide).name == "cuda:simple"
    assert not [w for w in caught if issubclass(w.category, BackendFallbackWarning)]
    assert fake_device["runs"] == ["simple"]  # the next kernel's self-test, not the offset kernel's
    calls = []
    monkeypatch.setattr(engine, "accumulate_tensors", lambda kernel, *args: calls.append(kernel) or torch.zeros(1))
    a = torch.zeros(2, 96).to(torch.float8_e4m3fn)
    assert cuda_backend.accumulate("cuda:offset", a, a, "e4m3", "e4m3", odd, True,
                                   context=for_call()).kernel == "cuda:offset"
    assert cuda_backend.accumulate("cuda:offset", a, a, "e4m3", "e4m3", odd, False,
                                   context=for_call()).kernel == "cuda:simple"
    assert calls == ["offset", "simple"]
    monkeypatch.setenv("MMAEMU_TEST_FORCE_FAIL", "simple")
    fallback = cuda_backend.accumulate("cuda:offset", a, a, "e4m3", "e4m3", odd, False, context=for_call())
    assert fallback.values.device.type == "cpu" and fallback.kernel is None  # its epilogue is told: the cpu engine
    assert calls == ["offset", "simple"]  # no kernel left: the cpu engine computed


def test_verdicts_are_cached_on_disk_by_device_and_sources(fake_device, tmp_path):
    import mmaemu.cuda as cuda_backend
    from mmaemu.cuda.verdicts import selftest

    fake_device["outcomes"]["simple"] = RuntimeError("transient")
    results = backends.selftest(CUDA0)
    assert {k: g[0].passed for k, g in results.items()} == {"cuda:native": True, "cuda:offset": True,
                                                            "cuda:simple": False, "cuda:epilogue": True}
    files = sorted((tmp_path / "cache" / "verdicts").glob("*.json"))
    assert len(files) == 3  # the self-test that raised is not written
    record = json.loads(files[0].read_text())
    assert record["key"]["device"]["uuid"] == "GPU-1234" and record["key"]["sources"] == selftest.sources_hash()
    assert record["key"]["mmaemu"] == mmaemu.__version__
    # A new process (memory forgotten) reads the verdicts from disk without running them.
    cuda_backend.reset()
    fake_device["runs"].clear()
    fake_device["outcomes"]["simple"] = True
    again = backends.selftest(CUDA0)
    assert again["cuda:offset"][0].cached and again["cuda:epilogue"][0].cached
    assert not again["cuda:simple"][0].cached and again["cuda:simple"][0].passed
    assert fake_device["runs"] == ["simple"]
    # force=True reruns; another device identity has its own verdicts.
    backends.selftest(CUDA0, kernels="offset", force=True)
    assert fake_device["runs"] == ["simple", "offset"]
    fake_device["info"] = fake_device["info"]._replace(uuid="GPU-5678")
    backends.selftest(CUDA0, kernels=["cuda:offset"])
    assert fake_device["runs"] == ["simple", "offset", "offset"]


def test_status_with_a_device(fake_device):
    fake_device["outcomes"]["simple"] = False
    status = backends.backends_status(CUDA0)
    assert status["cuda:offset"].available and not status["cuda:offset"].validated_here
    assert "not validated yet" in status["cuda:offset"].reason and fake_device["runs"] == []  # status runs nothing
    results = backends.selftest(CUDA0)
    assert backends.selftest_verdict(results) == ("FAIL", "failed: cuda:simple")
    status = backends.backends_status(CUDA0)
    assert status["cuda:offset"].validated_here and status["cuda:offset"].reason.startswith("validated on cuda:0")
    assert not status["cuda:simple"].available and "self-test failed" in status["cuda:simple"].reason
    assert backends.selftest_verdict(backends.selftest(CUDA0, kernels="offset")) == ("PASS", "every kernel passed")


def test_native_kernel_runs_each_devices_own_instruction_for_its_preset_only(fake_device):
    """sm_90 (numba-cuda): the warpgroup MMA for hopper; sm_89 (any numba): mma.sync for ada; the other preset, or
    another GPU, goes to the next kernel without a warning (never FP8 mma.sync for hopper)."""

    import mmaemu.cuda as cuda_backend
    from mmaemu.base.device_facts import DeviceFacts

    ada = get_preset("ada", warn=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ada_on_h100 = backends.select(CUDA0, "auto", "e4m3", "e4m3", ada)
        fake_device["info"] = DeviceFacts(0, "Fake Ada", "GPU-89", (8, 9), 24, None, torch.__version__, None, None,
                                          "13.0", compiler="numba 0.68 (built-in CUDA target)")
        cuda_backend.reset()
        ada_on_ada = backends.select(CUDA0, "auto", "e4m3", "e5m2", ada)
        hopper_on_ada = backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER)
        fake_device["info"] = fake_device["info"]._replace(capability=(12, 0))
        cuda_backend.reset()
        on_sm120 = backends.select(CUDA0, "auto", "e4m3", "e4m3", ada)
    assert not [w for w in caught if issubclass(w.category, BackendFallbackWarning)]
    assert ada_on_h100.name == "cuda:offset" and ada_on_h100.fallbacks == [
        "cuda:native: computes the hopper preset's block on sm_90 (wgmma), preset 'ada' has another"]
    assert ada_on_ada == backends.Selection("cuda:native", [])
    assert hopper_on_ada.name == "cuda:offset" and hopper_on_ada.fallbacks[0].startswith(
        "cuda:native: computes the ada preset's block on sm_89 (mma_sync)")
    assert on_sm120.name == "cuda:offset" and "this device is sm_120" in on_sm120.fallbacks[0]
    assert fake_device["runs"].count("native") == 1  # only sm_89 ran its self-test (on its probe-and-GEMM gate)
    with pytest.raises(BackendUnavailableError, match="cuda:native: issues the native FP8 MMA of sm_90a"):
        backends.select(CUDA0, "cuda:native", "e4m3", "e4m3", ada)


def test_epilogue_stays_on_cpu_for_accumulators_not_made_by_a_kernel(fake_device):
    import mmaemu.cuda as cuda_backend

    acc = torch.zeros(2, 2)
    assert cuda_backend.epilogue(acc, torch.tensor(1.0), torch.tensor(1.0), None, torch.bfloat16, None,
                                 context=for_call()) == (None, ())
    assert fake_device["runs"] == []


def test_epilogue_of_a_kernels_accumulator_runs_on_the_device_or_warns_once(fake_device, monkeypatch):
    """The epilogue is told which kernel computed the accumulator; a failed self-test of the epilogue kernel is a
    warning returned as data (reported by the edge: once per process)."""
    import mmaemu.cuda as cuda_backend
    from mmaemu.cuda.dispatch import engine

    monkeypatch.setattr(engine, "epilogue_tensors", lambda acc, *args: "on the device")
    acc, one = torch.zeros(2, 2), torch.tensor(1.0)
    fake_device["outcomes"]["epilogue"] = False
    outcome = cuda_backend.epilogue(acc, one, one, None, torch.bfloat16, "cuda:simple", context=for_call())
    assert outcome.result is None and [n.category for n in outcome.notices] == [BackendFallbackWarning]
    assert outcome.notices[0].message == (
        "mmaemu on cuda:0 (Fake GPU, sm_90): cuda:epilogue: 1 of 1 cases differ from the CPU reference; first: stub: "
        "3 outputs, e.g. []; the cpu epilogue computes (result copied back to the device)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            mmaemu.warn.report(cuda_backend.epilogue(acc, one, one, None, torch.bfloat16, "cuda:simple",
                                                     context=for_call()).notices)
    assert [str(w.message) for w in caught] == [outcome.notices[0].message]
    fake_device["outcomes"]["epilogue"] = True
    backends.selftest(CUDA0, kernels="epilogue", force=True)
    assert cuda_backend.epilogue(acc, one, one, None, torch.bfloat16, "cuda:simple", context=for_call()) == \
        ("on the device", ())


def test_one_rule_chooses_a_kernel():
    """choose(): the first kernel that does not decline and whose verdict passes; a verdict is asked only of a
    kernel that does not decline; failures are announced only with a device label."""
    from mmaemu.cuda.catalog import GateResult
    from mmaemu.cuda.dispatch.gating import choose

    kernels = backends.gemm_kernels()
    asked = []

    def verdict(kernel):
        asked.append(kernel.name)
        return GateResult("selftest", kernel.name == "simple", f"{kernel.name} failed", {}, 0.0, False)

    def decline(kernel):
        return "not mine" if kernel.name == "native" else None

    choice = choose(kernels, decline, verdict, device_label="cuda:0 (X)")
    assert choice.kernel.name == "simple" and asked == ["offset", "simple"]
    assert choice.passed_over == ("cuda:native: not mine", "cuda:offset: offset failed")
    assert [n.message for n in choice.notices] == ["mmaemu on cuda:0 (X): cuda:offset: offset failed; cuda:simple "
                                                   "computes instead"]
    quiet = choose(kernels[:2], decline, verdict)
    assert quiet.kernel is None and quiet.notices == () and len(quiet.passed_over) == 2


def test_kernel_metadata_for_the_cli():
    import mmaemu.cuda as cuda_backend

    assert [k.backend for k in backends.gemm_kernels()] == ["cuda:native", "cuda:offset", "cuda:simple"]
    for k in cuda_backend.KERNELS.values():
        # Only the native kernel's bits are the hardware's: it alone is gated by an instruction probe.
        expected = (True, (), (8, 9)) if k.name == "native" else (False, (), None)
        assert (k.gated, k.validated_on, k.min_cc) == expected


def test_selftest_cases_cover_the_contract():
    from mmaemu.cuda.verdicts import selftest

    cases = selftest.GEMM_CASES
    assert {c.preset for c in cases} == {"hopper", "ada", "b200_mma_sync"}
    assert {c.scheme for c in cases} == {"none", "contiguous", "serial", "pairwise"}
    assert {c.fast for c in cases} == {True, False}
    assert {c.data for c in cases} == {"random", "adversarial", "nonfinite"}
    for case in cases:
        a, b = selftest.gemm_operands(case)
        assert a.shape == (case.M, case.K) and b.shape == (case.N, case.K)
        if case.data != "nonfinite":
            from mmaemu import formats

            assert not formats.nonfinite_mask(a, case.fmt_a).any() and not formats.nonfinite_mask(b, case.fmt_b).any()


# ----------------------------------------------------------------------------------------------------------------
# The device checks (tests/test_gpu_kernels.py, run by scripts/gpu_check.py on a GPU) on a machine without one


@pytest.mark.subprocess
def test_the_device_checks_are_collected_under_the_cuda_marker():
    """``pytest -m cuda`` (what scripts/gpu_check.py runs) imports and collects every device check here too."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "cuda", "-p", "no:cacheprovider",
               "tests/test_gpu_kernels.py", "tests/test_cuda_device.py"]
    run = subprocess.run(command, capture_output=True, text=True, cwd=str(ROOT),
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    ids = {line.split("[")[0] for line in run.stdout.splitlines() if "::" in line}
    assert {f"tests/test_gpu_kernels.py::{name}" for name in (
        "test_every_kernel_passes_its_selftest", "test_native_instruction_probe_computes_the_presets_block",
        "test_kernel_matches_the_cpu_reference_on_larger_gemms",
        "test_scaled_mm_through_each_kernel_matches_the_cpu_backend")} <= ids
    assert any(i.startswith("tests/test_cuda_device.py::") for i in ids)


def test_the_device_checks_cases_run_against_the_cpu_reference():
    """The larger GEMMs of the device checks, shrunk, through the self-test harness with the CPU fast path as the
    'device': their operands, schedules and reference are sound, and a wrong result is caught."""
    import numpy as np

    from mmaemu.cpu import accumulate_codes
    from mmaemu.cuda.verdicts import selftest
    from test_gpu_kernels import COMPARE_CASES

    def compute(case, a, b):
        return accumulate_codes(a, b, case.fmt_a, case.fmt_b, get_preset(case.preset, warn=False), case.fast,
                                case.splits, case.scheme)

    cases = [case.shrunk() for case in COMPARE_CASES]
    passed, details = selftest.run_gemm_cases(compute, cases)
    assert passed and [d["case"] for d in details] == [c.label for c in COMPARE_CASES]
    wrong, _ = selftest.run_gemm_cases(lambda case, a, b: np.nextafter(compute(case, a, b), np.float32(np.inf)),
                                       cases[:1])
    assert not wrong


def test_gpu_check_reads_the_device_checks_report(tmp_path):
    """scripts/gpu_check.py's summary of the device checks (pytest's JUnit XML): counts and the failures' ids."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    xml = tmp_path / "pytest.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="tests.test_gpu_kernels" name="test_a"/>'
                   '<testcase classname="tests.test_gpu_kernels" name="test_b[simple]"><failure message="3 differ"/>'
                   '</testcase><testcase classname="t" name="c"><skipped message="no GPU"/></testcase>'
                   '<testcase classname="t" name="d"><error message="fixture"/></testcase></testsuite></testsuites>')
    assert gpu_check._junit_counts(xml) == {
        "counts": {"passed": 1, "failed": 1, "errors": 1, "skipped": 1},
        "failures": [("tests.test_gpu_kernels::test_b[simple]", "3 differ"), ("t::d", "fixture")]}
    assert gpu_check._junit_counts(tmp_path / "missing.xml") == {"counts": None, "failures": []}
    assert {"tests/test_gpu_kernels.py", "tests/test_cuda_device.py"} <= set(gpu_check.cuda_test_files())


def test_bench_cuda_without_a_device_skips_saying_why_and_renders_its_tables(tmp_path):
    """scripts/bench.py --cuda (the speed part of gpu_check) on a machine without a GPU: both sections skipped with
    the reason; the tables of a device run render (their figures come from the run, not from here)."""
    import importlib.util

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    spec = importlib.util.spec_from_file_location("bench_cuda", ROOT / "scripts" / "bench_cuda.py")
    bench_cuda = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_cuda)
    path = tmp_path / "bench_cuda.json"
    assert bench_cuda.main(["--json", str(path), "--budget", "60"]) == 0
    report = json.loads(path.read_text())
    assert [(s["name"], s["status"]) for s in report["sections"]] == [("offset", "skipped"), ("native", "skipped")]
    assert all(s["error"].startswith("no usable CUDA device") for s in report["sections"])
    case = {"kernel": "cuda:offset", "case": "hopper fast", "shape": [2048, 5760, 1920], "best_s": 0.01,
            "tmac_per_s": 2.265, "checked_rows": 32, "mismatches": 0, "first": [], "sass_per_product": 3.16,
            "bound_tmac_per_s": 10.58, "fraction_of_bound": 0.2141}
    report["sections"] = [{"name": "offset", "status": "ok", "seconds": 1.0, "error": None, "result": {
        "dry_run": False, "issue_rate": 3.345e13, "issue_rate_source": "132 SMs", "sass_per_product": {"hopper": 3.16},
        "sass_source": "--sass-per-product", "cases": [case], "native": {}, "agreement": {}}}]
    text = bench_cuda.markdown(report)
    assert "| cuda:offset | hopper fast | [2048, 5760, 1920] | 0.01 | 2.265 | 3.16 | 10.58 | 21% | 0 (32) |" in text


def test_damaged_or_unprotected_verdicts_are_ignored_and_the_selftest_runs_again(fake_device, tmp_path,
                                                                                 monkeypatch):
    import mmaemu.cuda as cuda_backend
    from mmaemu.base import _cache
    from mmaemu.errors import CacheWarning

    mmaemu.warn.reset()
    backends.selftest(CUDA0, kernels="simple")
    [path] = (tmp_path / "cache" / "verdicts").glob("*.json")
    good = json.loads(path.read_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for damaged in (b"\xff\xfe not json", b"[" * 100_000, json.dumps({**good, "seconds": "soon"}).encode()):
            path.write_bytes(damaged)
            cuda_backend.reset()
            fake_device["runs"].clear()
            result = backends.selftest(CUDA0, kernels="simple")["cuda:simple"][0]
            assert result.passed and not result.cached and fake_device["runs"] == ["simple"]
            assert json.loads(path.read_text())["passed"] is True  # written again
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(messages) == 1 and messages[0].startswith(f"mmaemu ignores the self-test verdict {path}")
    # A verdicts folder others could write is neither read nor written.
    path.parent.chmod(0o777)
    before = path.read_bytes()
    for _ in range(2):
        cuda_backend.reset()
        fake_device["runs"].clear()
        assert not backends.selftest(CUDA0, kernels="simple")["cuda:simple"][0].cached
        assert fake_device["runs"] == ["simple"] and path.read_bytes() == before

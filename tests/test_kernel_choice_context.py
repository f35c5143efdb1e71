"""The CUDA kernel choice decides from the context it is given (issue 17): the verdicts come from the context's
source (``Context.verdicts``, else the process's), the kernels forced to fail and the CUDA switch from its
environment, never from the process environment read inside the kernels layer. No GPU: the device probe is the one
step replaced (a fake sm_90 device); every verdict comes from a stub source given in the context.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import pathlib
import warnings

import pytest
import torch

from mmaemu import backends, environment
from mmaemu.context import Context
from mmaemu.cuda.catalog import GateResult
from mmaemu.cuda.dispatch import gating
from mmaemu.device_facts import DeviceFacts
from mmaemu.errors import BackendFallbackWarning
from mmaemu.model.presets import Preset, get_preset

ROOT = pathlib.Path(__file__).resolve().parent.parent
HOPPER = get_preset("hopper", warn=False)
CUDA0 = torch.device("cuda", 0)
H100 = DeviceFacts(0, "Fake GPU", "GPU-1234", (9, 0), 132, None, torch.__version__, None, None, "13.0",
                   compiler="numba 0.68 + numba-cuda 0.30")


# Fresh verdicts and selections (tests/conftest.py); the tests count what the first selection warns.
pytestmark = pytest.mark.usefixtures("fresh_dispatcher", "fresh_warnings")


@pytest.fixture
def device(monkeypatch):
    """The device probe answers a fake H100 (``state["info"]``); nothing else of the dispatcher is replaced."""
    state = {"info": H100}
    monkeypatch.setattr(gating, "_probe", lambda device=None: state["info"])
    return state


def verdict_source(outcomes, asked=None):
    """A stub verdict source: ``outcomes[kernel]`` True/False (default True), or None for "no verdict yet" (read
    by status and the default choice only); ``asked`` lists the kernels asked, in order."""

    def source(info, kernel):
        if asked is not None:
            asked.append(kernel)
        outcome = outcomes.get(kernel, True)
        if outcome is None:
            return None
        return GateResult("selftest", outcome, "" if outcome else f"stub says {kernel} fails", {}, 0.0, True)

    return source


def context(verdicts=None, **variables) -> Context:
    """A context of the MMAEMU_* ``variables`` (nothing else set), with the verdict source ``verdicts``."""
    return Context(environment.snapshot(variables), verdicts=verdicts)


def fallback_messages(caught):
    return [str(w.message) for w in caught if issubclass(w.category, BackendFallbackWarning)]


# ----------------------------------------------------------------------------------------------------------------
# Selection


def test_a_selection_decides_from_the_contexts_verdicts_and_warns_once(device):
    asked = []
    given = context(verdict_source({"native": False}, asked))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER, context=given)
        again = backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER, context=given)
    assert first == again == backends.Selection("cuda:offset", ["cuda:native: stub says native fails"])
    assert asked == ["native", "offset", "native", "offset"]  # a context's own source is asked every time
    assert fallback_messages(caught) == [
        "mmaemu on cuda:0 (Fake GPU, sm_90): cuda:native: stub says native fails; cuda:offset computes instead"]


def test_a_contexts_own_verdicts_never_meet_the_process_selections(device):
    """The process keeps the selections made from its own verdicts; one made from a context's source is neither
    kept nor read, so two sources never answer for each other."""
    failing = context(verdict_source({"native": False, "offset": False}))
    passing = context(verdict_source({}))
    with pytest.warns(BackendFallbackWarning, match="cuda:simple computes instead"):
        assert backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER, context=failing).name == "cuda:simple"
    assert backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER, context=passing).name == "cuda:native"
    assert backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER, context=failing).name == "cuda:simple"


def test_forced_failures_come_from_the_context_not_the_process(device, monkeypatch):
    asked = []
    forced = context(verdict_source({}, asked), MMAEMU_TEST_FORCE_FAIL="native")
    with pytest.warns(BackendFallbackWarning, match="cuda:native: forced to fail by MMAEMU_TEST_FORCE_FAIL"):
        selection = backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER, context=forced)
    assert selection == backends.Selection("cuda:offset",
                                           ["cuda:native: forced to fail by MMAEMU_TEST_FORCE_FAIL"])
    assert asked == ["offset"]  # a forced failure is decided before the source is asked
    monkeypatch.setenv("MMAEMU_TEST_FORCE_FAIL", "native,offset")  # the process's value: not the context's
    assert backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER, context=context(verdict_source({}))).name == \
        "cuda:native"


def test_the_cuda_switch_comes_from_the_context(device, monkeypatch):
    monkeypatch.setenv("MMAEMU_DISABLE_CUDA", "1")
    assert backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER, context=context(verdict_source({}))).name == \
        "cuda:native"
    monkeypatch.delenv("MMAEMU_DISABLE_CUDA")
    off = context(verdict_source({}), MMAEMU_DISABLE_CUDA="yes")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        selection = gating.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER, context=off)
    assert selection.name == "cpu" and selection.fallbacks == ["cuda: disabled by MMAEMU_DISABLE_CUDA"]
    assert caught == []  # a decision returns its warnings as data
    assert [n.message for n in selection.notices] == [
        "mmaemu: cuda: disabled by MMAEMU_DISABLE_CUDA; the cpu backend computes and the result is copied back to "
        "the device"]
    statuses = backends.backends_status(CUDA0, context=off)
    assert statuses["cuda:native"].reason == "disabled by MMAEMU_DISABLE_CUDA"
    assert backends.selftest(CUDA0, context=off)["cuda:simple"][0].reason == \
        "not run: disabled by MMAEMU_DISABLE_CUDA"
    assert gating.run_selftests(CUDA0, ["simple"], context=off)["cuda:simple"][0].reason == \
        "not run: disabled by MMAEMU_DISABLE_CUDA"


def test_status_and_selftests_read_the_contexts_verdicts(device):
    given = context(verdict_source({"native": None, "offset": False}), MMAEMU_TEST_FORCE_FAIL="simple")
    statuses = backends.backends_status(CUDA0, context=given)
    assert statuses["cuda:native"].available and not statuses["cuda:native"].validated_here
    assert statuses["cuda:offset"].reason == "self-test failed on cuda:0 (Fake GPU, sm_90): stub says offset fails"
    assert statuses["cuda:simple"].validated_here  # status reads known verdicts: forced failures are not applied
    results = backends.selftest(CUDA0, kernels="offset,simple,epilogue", context=given)
    assert {name: (g[0].passed, g[0].reason) for name, g in results.items()} == {
        "cuda:offset": (False, "stub says offset fails"),
        "cuda:simple": (False, "forced to fail by MMAEMU_TEST_FORCE_FAIL"), "cuda:epilogue": (True, "")}


# ----------------------------------------------------------------------------------------------------------------
# The per-call fallback and the epilogue


ODD = Preset("odd-slow", nfma=16, frac=13, frac_out=13, min_exp=-132, late_c=False, slow_chunk=80)


def test_the_per_call_fallback_reads_the_calls_context(device, monkeypatch):
    """A call the offset kernel declines by design (slow accumulation over 80-wide chunks) goes to the kernel the
    rule picks below it, by the verdicts of the call's context."""
    from mmaemu.cuda.dispatch import engine

    calls = []
    monkeypatch.setattr(engine, "accumulate_tensors", lambda kernel, *args: calls.append(kernel) or torch.zeros(1))
    a = torch.zeros(2, 96).to(torch.float8_e4m3fn)
    asked = []
    passing = context(verdict_source({}, asked))
    assert gating.accumulate("cuda:offset", a, a, "e4m3", "e4m3", ODD, False, context=passing).kernel == \
        "cuda:simple"
    assert calls == ["simple"] and asked == ["simple"]
    failing = context(verdict_source({"simple": False}))
    fallback = gating.accumulate("cuda:offset", a, a, "e4m3", "e4m3", ODD, False, context=failing)
    assert fallback.kernel is None and fallback.values.shape == (2, 2)  # the cpu engine computed
    forced = context(verdict_source({}), MMAEMU_TEST_FORCE_FAIL="simple")
    assert gating.accumulate("cuda:offset", a, a, "e4m3", "e4m3", ODD, False, context=forced).kernel is None
    assert calls == ["simple"]


def test_the_epilogue_reads_the_calls_context(device, monkeypatch):
    from mmaemu.cuda.dispatch import engine

    monkeypatch.setattr(engine, "epilogue_tensors", lambda acc, *args: "on the device")
    acc, one = torch.zeros(2, 2), torch.tensor(1.0)
    passing = context(verdict_source({}))
    assert gating.epilogue(acc, one, one, None, torch.bfloat16, "cuda:simple", context=passing) == \
        ("on the device", ())
    outcome = gating.epilogue(acc, one, one, None, torch.bfloat16, "cuda:simple",
                              context=context(verdict_source({"epilogue": False})))
    assert outcome.result is None and [n.message for n in outcome.notices] == [
        "mmaemu on cuda:0 (Fake GPU, sm_90): cuda:epilogue: stub says epilogue fails; the cpu epilogue computes "
        "(result copied back to the device)"]


def test_a_plan_carries_its_context_without_being_it():
    from mmaemu.plan import cache
    from mmaemu.plan.planner import plan_accumulate

    a = torch.zeros(4, 32).to(torch.float8_e4m3fn)
    given = context()
    plan = plan_accumulate(a, a, use_fast_accum=True, splitk=1, context=given)
    assert plan.context is given and "context" not in repr(plan)
    assert plan == dataclasses.replace(plan, context=context())  # a plan is what it decided, not where
    cache.clear()
    try:
        first = cache.cached_plan_accumulate(a, a, use_fast_accum=True, splitk=1)
        hit = cache.cached_plan_accumulate(a, a, use_fast_accum=True, splitk=1)
        assert cache.stats().hits == 1 and hit.context is first.context is not None  # same environment texts
    finally:
        cache.clear()


# ----------------------------------------------------------------------------------------------------------------
# mmaemu info's default engine: the rule of the selection


def _text_from_statuses(statuses) -> str:
    """The default engine as mmaemu info told it before it asked the dispatcher: from the Backends section."""
    kernels = [k.backend for k in backends.gemm_kernels() if statuses[k.backend].available]
    if not kernels:
        return "the CPU engine, the result copied back (no CUDA kernel can run here: see Backends)"
    if statuses[kernels[0]].validated_here:
        return f"{kernels[0]} (passed its self-test on this device)"
    return (f"the first of {', '.join(kernels)} that passes its self-test at the first call, else the CPU engine "
            f"(no verdict cached for {kernels[0]} yet: mmaemu selftest runs the self-tests)")


@pytest.mark.parametrize("capability, compiler", [((9, 0), "numba 0.68 + numba-cuda 0.30"),
                                                  ((8, 9), "numba 0.68 (built-in CUDA target)"),
                                                  ((12, 0), "numba 0.68 + numba-cuda 0.30")])
def test_info_tells_the_default_engine_the_backends_section_implies(device, capability, compiler):
    from mmaemu import diagnostics

    device["info"] = DeviceFacts(0, "Fake GPU", None, capability, 24, None, torch.__version__, None, None, None,
                                 compiler=compiler)
    section = {"available": True, "index": 0}
    for outcomes in itertools.product((True, False, None), repeat=3):
        given = context(verdict_source(dict(zip(("native", "offset", "simple"), outcomes))))
        expected = _text_from_statuses(backends.backends_status(CUDA0, context=given))
        assert diagnostics._default_cuda_engine(section, given) == expected, outcomes


def test_default_choice_without_a_usable_device():
    choice = gating.default_choice(CUDA0, context=context(MMAEMU_DISABLE_CUDA="1"))
    assert choice == gating.DefaultChoice(None, False, (), "disabled by MMAEMU_DISABLE_CUDA")


# ----------------------------------------------------------------------------------------------------------------
# The kernels layer reads no environment


def test_no_module_of_the_cuda_package_reads_the_environment():
    """mmaemu.cuda imports neither mmaemu.environment nor calls ``environment.snapshot()``: its decisions read the
    context they are given (or, given none, :func:`mmaemu.context.for_call`)."""
    from test_imports import import_graph, module_files

    modules = module_files()
    graph = import_graph(modules)
    cuda = [name for name in modules if name == "mmaemu.cuda" or name.startswith("mmaemu.cuda.")]
    assert "mmaemu.cuda.dispatch.gating" in cuda
    assert not [name for name in cuda if "mmaemu.environment" in graph[name]]
    for name in cuda:
        tree = ast.parse(modules[name][0].read_text())
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "snapshot"
                 and isinstance(node.value, ast.Name) and node.value.id == "environment"]
        assert not calls, name


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_the_device_probe_is_told_whether_cuda_is_disabled(monkeypatch):
    from mmaemu.cuda import device as cuda_device

    with pytest.raises(cuda_device.DeviceUnavailable, match="^disabled by MMAEMU_DISABLE_CUDA$"):
        cuda_device.probe(CUDA0, disabled=True)
    monkeypatch.setenv("MMAEMU_DISABLE_CUDA", "1")  # the process's variable is its callers' to read
    with pytest.raises(cuda_device.DeviceUnavailable, match="no CUDA device visible to torch"):
        cuda_device.probe(CUDA0)

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
from mmaemu.base.device_facts import DeviceFacts
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


def fake_gpu_front_door(monkeypatch, front_door, planner_name, on_cuda0):
    """A front door's planning on cuda:0 of a fake H100, for tests of block-wise front doors without a GPU: the
    device probe answers :data:`H100`; ``front_door.<planner_name>`` is replaced by ``on_cuda0(real planner, *args,
    **options)`` (which asks the real one with the device cuda:0), each answer recorded in ``state["planned"]``;
    ``front_door.for_call`` gives ``state["verdicts"]`` as the context's verdict source when set (None: the
    process's); the block-wise CUDA kernel's launch is recorded (``state["launches"]``: the kernels' names) and
    computed by the CPU reference engine. Returns ``state``."""
    import mmaemu.cuda.blockwise.kernel as blockwise_kernel
    from mmaemu import context as context_module
    from mmaemu.cpu.chunked import accumulate_chunked_codes

    state = {"launches": [], "verdicts": None, "planned": []}
    monkeypatch.setattr(gating, "_probe", lambda device=None: H100)
    real_planner, real_for_call = getattr(front_door, planner_name), context_module.for_call

    def planner(*args, **options):
        answer = on_cuda0(real_planner, *args, **options)
        state["planned"].append(answer)
        return answer

    def launch(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel):
        state["launches"].append(kernel.name)
        return accumulate_chunked_codes(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel, reference=True)

    def for_call():
        given = real_for_call()
        return given if state["verdicts"] is None else dataclasses.replace(given, verdicts=state["verdicts"])

    monkeypatch.setattr(front_door, planner_name, planner)
    monkeypatch.setattr(front_door, "for_call", for_call)
    monkeypatch.setattr(blockwise_kernel, "accumulate_chunked_numpy", launch)
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
    from mmaemu.cli import diagnostics

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


# ----------------------------------------------------------------------------------------------------------------
# The kernel registry: every kernel one entry, served by the one choice


def test_every_cuda_kernel_is_one_registry_entry_and_the_self_tested_ones_are_the_listed_kernels():
    from mmaemu.cuda import catalog

    assert list(catalog.REGISTRY) == ["native", "offset", "simple", "epilogue", "rowwise_epilogue", "blockwise",
                                      "block_scaled"]
    assert list(catalog.KERNELS) == ["native", "offset", "simple", "epilogue"]  # status, selftest, mmaemu info
    assert [k.name for k in catalog.candidates("tensorwise")] == ["native", "offset", "simple"]
    assert [k.name for k in catalog.candidates("rowwise")] == ["native", "offset", "simple"]
    assert [k.name for k in catalog.candidates("blockwise")] == ["blockwise"]
    assert [k.name for k in catalog.candidates("block_scaled")] == ["block_scaled"]
    assert [k.name for k in catalog.candidates("tensorwise", "epilogue")] == ["epilogue"]
    assert [k.name for k in catalog.candidates("rowwise", "epilogue")] == ["rowwise_epilogue"]
    for entry in catalog.REGISTRY.values():  # every function an entry names exists (imports numba.cuda, no GPU)
        for ref in (entry.declines, entry.device_declines, entry.launch):
            assert ref is None or callable(ref.resolve()), (entry.name, ref)
        assert (entry.selftest is None) == (entry.name not in catalog.KERNELS)
    assert catalog.REGISTRY["blockwise"].backend == catalog.REGISTRY["block_scaled"].backend == "cuda:simple"


def test_the_block_wise_decline_comes_from_the_registry():
    from mmaemu.cuda.blockwise.kernel import chunked_decline

    assert chunked_decline("cuda:simple") is None
    assert chunked_decline("cuda:offset").startswith("the offset kernel keeps one fp32 accumulator per output")
    assert chunked_decline("cuda:native").startswith("the native tensor-core kernel is gated for cuBLASLt's chains")
    assert chunked_decline("cuda:epilogue") == \
        "only cuda:simple computes block-wise kernels ('epilogue' is not one of them)"


def test_a_recipes_kernel_runs_under_the_verdict_it_is_vouched_by(device):
    passing = context(verdict_source({}))
    choice = gating.recipe_kernel("blockwise", "cuda:simple", CUDA0, context=passing)
    assert choice.kernel.name == "blockwise" and choice.passed_over == ()
    failing = context(verdict_source({"simple": False}))
    for recipe in ("blockwise", "block_scaled"):
        choice = gating.recipe_kernel(recipe, "cuda:simple", CUDA0, context=failing)
        assert choice.kernel is None and choice.passed_over == ("cuda:simple: stub says simple fails",)
    assert gating.recipe_kernel("blockwise", "cuda:offset", CUDA0, context=passing).passed_over == \
        ("cuda:offset: no blockwise kernel answers to it",)
    off = context(verdict_source({}), MMAEMU_DISABLE_CUDA="1")
    assert gating.recipe_kernel("block_scaled", "cuda:simple", CUDA0, context=off).passed_over == \
        ("cuda: disabled by MMAEMU_DISABLE_CUDA",)


def test_a_kernel_without_a_verdict_never_runs_on_a_device():
    from mmaemu.cuda import catalog

    entry = catalog.REGISTRY["rowwise_epilogue"]
    assert gating.entry_verdict(entry, H100, verdict_source({})) is gating.NO_SELFTEST
    choice = gating.choose([entry], lambda k: None, lambda k: gating.entry_verdict(k, H100, verdict_source({})))
    assert choice.kernel is None and choice.passed_over == ("cuda:rowwise_epilogue: no device self-test of its own",)


def test_a_context_carries_the_device_facts_the_choice_reads(monkeypatch):
    probed = []
    monkeypatch.setattr(gating, "_probe", lambda device=None: probed.append(device) or H100)
    carried = gating.device_context(CUDA0, context(verdict_source({})))
    assert carried.device == H100 and carried.device_problem is None and probed == [CUDA0]
    assert backends.select(CUDA0, "auto", "e4m3", "e4m3", HOPPER, context=carried).name == "cuda:native"
    assert gating.default_choice(0, context=carried).kernel.name == "native"
    assert probed == [CUDA0]  # the decisions read the context's facts: nothing probed again
    gating.select(torch.device("cuda", 1), "auto", "e4m3", "e4m3", HOPPER, context=carried)
    assert probed == [CUDA0, torch.device("cuda", 1)]  # another device: its own facts
    off = gating.device_context(CUDA0, context(MMAEMU_DISABLE_CUDA="1"))
    assert off.device is None and off.device_problem == "disabled by MMAEMU_DISABLE_CUDA"


def test_the_device_facts_identity_keys_the_verdicts_as_before():
    assert H100.identity() == {"name": "Fake GPU", "uuid": "GPU-1234", "capability": [9, 0],
                               "driver": "CUDA driver API 13.0", "compiler": "numba 0.68 + numba-cuda 0.30",
                               "torch": torch.__version__}
    assert H100._replace(display_driver="570.1").driver == "CUDA driver API 13.0, display driver 570.1"
    assert H100.label == "cuda:0 (Fake GPU, sm_90)"


def test_the_self_test_cases_table_loads_as_gemm_cases(tmp_path):
    import json

    from mmaemu.cuda.verdicts import selftest

    cases = selftest.GEMM_CASES
    assert len(cases) == 23 and len({c.label for c in cases}) == 23 and len({c.seed for c in cases}) == 23
    assert cases[0] == selftest.GemmCase("random hopper fast", "hopper", "e4m3", "e4m3", True, 1, "none", 16, 8, 64,
                                         "random", 1)
    assert {c.preset for c in cases} == {"hopper", "ada", "b200_mma_sync"}
    assert all(isinstance(c.fast, bool) and isinstance(c.K, int) for c in cases)
    table = json.loads(selftest.CASES_FILE.read_text())
    table["columns"] = table["columns"][::-1]
    (tmp_path / "cases.json").write_text(json.dumps(table))
    with pytest.raises(ValueError, match="are not GemmCase's"):
        selftest._load_gemm_cases(tmp_path / "cases.json")


def test_the_row_wise_epilogue_kernel_never_runs_on_a_device_without_a_verdict(device):
    import types

    acc = types.SimpleNamespace(device=CUDA0)  # the kernel is not launched: nothing reads the values
    outcome = gating.rowwise_epilogue(acc, None, None, None, True, context=context(verdict_source({})))
    assert outcome == gating.EpilogueOutcome(None, ())  # the recipe's CPU loops compute, nothing is warned


def test_a_preferred_block_scaled_cuda_kernel_that_may_not_run_leaves_the_call_to_the_cpu(device):
    import types

    from mmaemu.plan import steps

    preferred = context(verdict_source({"simple": False}), MMAEMU_BACKEND="cuda:simple")
    plan = types.SimpleNamespace(notices=[], fallbacks=[], backend=None, context=preferred)
    steps.choose_block_scaled_backend(plan, CUDA0, "auto", preferred, recipe="block_scaled")
    assert plan.backend == "cpu" and plan.fallbacks == ["cuda:simple: stub says simple fails"]
    assert plan.context.device == H100  # the plan keeps the facts its choice read

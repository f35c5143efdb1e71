"""mmaemu.deepgemm through the front door (issue 30 item 2) and its argument checks (issue 28 item 6).

The DeepGEMM face plans its engine as scaled_mm does (:mod:`mmaemu.plan.deepgemm`): from the call's context
(``MMAEMU_BACKEND``, ``MMAEMU_DISABLE_CUDA``, forced failures, the verdict source) and the CUDA kernel choice. No GPU
here: the device probe answers a fake H100 (as tests/test_kernel_choice_context.py does), the operands' device is
seen as ``cuda:0`` by the planner, and the block-wise CUDA kernel is replaced by a spy that records each launch and
computes with the CPU reference engine (the bits of ``cuda:simple`` itself are checked under the simulator in
tests/test_blockwise.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmaemu.deepgemm as dg
from mmaemu.cuda.dispatch import gating
from mmaemu.errors import BackendUnavailableError, ExperimentalPresetWarning, UnsupportedFeatureError
from mmaemu.model.chunked import DEEPGEMM_SM90_1D2D
from mmaemu.plan.deepgemm import CUDA_SIMPLE_UNCHECKED, plan_blockwise

from test_kernel_choice_context import CUDA0, H100, context, fake_gpu_front_door, verdict_source

pytestmark = [pytest.mark.usefixtures("fresh_dispatcher", "fresh_warnings"),
              pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning")]


def operands(m=8, n=256, k=256, seed=3):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
    w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)).to(torch.bfloat16)
    return dg.per_token_cast_to_fp8(x, use_ue8m0=False), dg.per_block_cast_to_fp8(w, use_ue8m0=False)


def cpu_result(a, b, backend="cpu"):
    d = torch.empty((a[0].shape[0], b[0].shape[0]), dtype=torch.bfloat16)
    dg.fp8_gemm_nt(a, b, d, backend=backend)
    return d


@pytest.fixture
def on_fake_gpu(monkeypatch):
    """The planner sees the operands on cuda:0 of a fake H100 (:func:`fake_gpu_front_door`)."""
    return fake_gpu_front_door(monkeypatch, dg, "plan_blockwise",
                               lambda plan, kernel, device, backend, *, context=None:
                               plan(kernel, CUDA0, backend, context=context))


# ----------------------------------------------------------------------------------------------------------------
# 30.2: the context and the kernel choice apply


def test_cuda_simple_runs_the_cuda_kernel_where_its_verdict_passes_with_the_same_bits(on_fake_gpu):
    a, b = operands()
    expected = cpu_result(a, b)
    on_fake_gpu["verdicts"] = verdict_source({})
    for backend in ("cuda:simple", "cuda"):
        d = torch.empty_like(expected)
        dg.fp8_gemm_nt(a, b, d, backend=backend)
        assert torch.equal(d.view(torch.int16), expected.view(torch.int16)), backend
    assert on_fake_gpu["launches"] == [DEEPGEMM_SM90_1D2D.name] * 2
    assert [p.backend for p in on_fake_gpu["planned"]] == ["cpu", "cuda:simple", "cuda:simple"]


def test_disabled_cuda_never_runs_a_cuda_kernel(on_fake_gpu, monkeypatch):
    a, b = operands()
    d = torch.zeros((8, 256), dtype=torch.bfloat16)
    monkeypatch.setenv("MMAEMU_DISABLE_CUDA", "1")
    on_fake_gpu["verdicts"] = verdict_source({})
    for backend in ("cuda:simple", "cuda"):
        with pytest.raises(BackendUnavailableError, match="disabled by MMAEMU_DISABLE_CUDA"):
            dg.fp8_gemm_nt(a, b, d, backend=backend)
    dg.fp8_gemm_nt(a, b, d)  # auto: the cpu engine
    assert on_fake_gpu["launches"] == [] and torch.equal(d.view(torch.int16), cpu_result(a, b).view(torch.int16))


def test_a_failed_verdict_refuses_the_cuda_kernel(on_fake_gpu, monkeypatch):
    a, b = operands()
    d = torch.zeros((8, 256), dtype=torch.bfloat16)
    on_fake_gpu["verdicts"] = verdict_source({"simple": False})
    with pytest.raises(BackendUnavailableError, match="cuda:simple: stub says simple fails"):
        dg.fp8_gemm_nt(a, b, d, backend="cuda:simple")
    on_fake_gpu["verdicts"] = verdict_source({})
    monkeypatch.setenv("MMAEMU_TEST_FORCE_FAIL", "simple")
    with pytest.raises(BackendUnavailableError, match="forced to fail by MMAEMU_TEST_FORCE_FAIL"):
        dg.fp8_gemm_nt(a, b, d, backend="cuda:simple")
    assert on_fake_gpu["launches"] == []


def test_mmaemu_backend_replaces_auto(on_fake_gpu, monkeypatch):
    from mmaemu.cpu import chunked

    a, b = operands()
    expected = cpu_result(a, b)
    engines = []
    real = chunked.accumulate_chunked_codes

    def spy(*args, reference=False, **options):
        engines.append("reference" if reference else "cpu")
        return real(*args, reference=reference, **options)

    monkeypatch.setattr(chunked, "accumulate_chunked_codes", spy)
    for variable, launches, engine in (("reference", [], ["reference"]), ("cuda:simple", ["1d2d"], []),
                                       ("cuda:offset", [], ["cpu"])):
        on_fake_gpu["launches"].clear()
        engines.clear()
        on_fake_gpu["verdicts"] = verdict_source({})
        monkeypatch.setenv("MMAEMU_BACKEND", variable)
        d = torch.empty_like(expected)
        dg.fp8_gemm_nt(a, b, d)
        assert torch.equal(d.view(torch.int16), expected.view(torch.int16)), variable
        assert ([k.rsplit("_", 1)[-1] for k in on_fake_gpu["launches"]], engines) == (launches, engine), variable
    plan = on_fake_gpu["planned"][-1]
    assert plan.backend == "cpu" and "offset kernel keeps one fp32 accumulator" in plan.fallbacks[0]
    monkeypatch.setenv("MMAEMU_BACKEND", "tpu")
    with pytest.raises(ValueError, match=r"unknown backend 'tpu' \(from MMAEMU_BACKEND\)"):
        dg.fp8_gemm_nt(a, b, torch.empty_like(expected))


def test_the_grouped_entries_plan_through_the_same_front_door(on_fake_gpu, monkeypatch):
    """The M-grouped GEMMs (masked and contiguous) are planned as fp8_gemm_nt is: MMAEMU_DISABLE_CUDA, a failed
    verdict, MMAEMU_BACKEND (a CUDA kernel that runs, one that declines: the fallback) apply to each."""
    a, b = operands()
    expected = cpu_result(a, b)
    a3, b3 = (a[0][None], a[1][None]), (b[0][None], b[1][None])
    masked, rows = torch.tensor([8], dtype=torch.int32), torch.zeros(8, dtype=torch.int32)

    def masked_call(**kwargs):
        d = torch.zeros((1, 8, 256), dtype=torch.bfloat16)
        dg.m_grouped_fp8_gemm_nt_masked(a3, b3, d, masked, 8, **kwargs)
        return d[0]

    def contiguous_call(**kwargs):
        d = torch.zeros((8, 256), dtype=torch.bfloat16)
        dg.m_grouped_fp8_gemm_nt_contiguous(a, b3, d, rows, **kwargs)
        return d

    for call in (masked_call, contiguous_call):
        on_fake_gpu["launches"].clear()
        on_fake_gpu["verdicts"] = verdict_source({})
        monkeypatch.setenv("MMAEMU_DISABLE_CUDA", "1")
        with pytest.raises(BackendUnavailableError, match="disabled by MMAEMU_DISABLE_CUDA"):
            call(backend="cuda:simple")
        monkeypatch.delenv("MMAEMU_DISABLE_CUDA")
        on_fake_gpu["verdicts"] = verdict_source({"simple": False})
        with pytest.raises(BackendUnavailableError, match="cuda:simple: stub says simple fails"):
            call(backend="cuda:simple")
        assert on_fake_gpu["launches"] == [], call.__name__
        on_fake_gpu["verdicts"] = verdict_source({})
        monkeypatch.setenv("MMAEMU_BACKEND", "cuda:simple")
        assert torch.equal(call().view(torch.int16), expected.view(torch.int16)), call.__name__
        assert on_fake_gpu["launches"] == [DEEPGEMM_SM90_1D2D.name], call.__name__
        monkeypatch.setenv("MMAEMU_BACKEND", "cuda:offset")
        assert torch.equal(call().view(torch.int16), expected.view(torch.int16)), call.__name__
        plan = on_fake_gpu["planned"][-1]
        assert plan.backend == "cpu" and "offset kernel" in plan.fallbacks[0], call.__name__
        assert on_fake_gpu["launches"] == [DEEPGEMM_SM90_1D2D.name], call.__name__
        monkeypatch.delenv("MMAEMU_BACKEND")


def test_the_plan_decides_from_the_context_it_is_given(monkeypatch):
    monkeypatch.setattr(gating, "_probe", lambda device=None: H100)
    kernel = DEEPGEMM_SM90_1D2D
    with pytest.warns(ExperimentalPresetWarning, match="no device self-test of its own"):
        plan = plan_blockwise(kernel, CUDA0, "cuda:simple", context=context(verdict_source({})))
    assert (plan.backend, plan.fallbacks) == ("cuda:simple", ())
    assert CUDA_SIMPLE_UNCHECKED.startswith("mmaemu.deepgemm on cuda:simple")
    auto = plan_blockwise(kernel, CUDA0, "auto", context=context(verdict_source({})))
    assert auto.backend == "cpu" and "only with backend='cuda:simple'" in auto.fallbacks[0]
    assert plan_blockwise(kernel, torch.device("cpu"), "auto", context=context()).fallbacks == ()
    off = context(verdict_source({}), MMAEMU_DISABLE_CUDA="yes")
    with pytest.raises(BackendUnavailableError, match="disabled by MMAEMU_DISABLE_CUDA"):
        plan_blockwise(kernel, CUDA0, "cuda:simple", context=off)
    with pytest.raises(BackendUnavailableError, match="offset kernel"):
        plan_blockwise(kernel, CUDA0, "cuda:offset", context=context(verdict_source({})))
    env = context(verdict_source({}), MMAEMU_BACKEND="reference")
    assert plan_blockwise(kernel, CUDA0, "auto", context=env).backend == "reference"
    assert plan_blockwise(kernel, CUDA0, "cpu", context=env).backend == "cpu"  # the argument wins over the variable


# ----------------------------------------------------------------------------------------------------------------
# 28.6: argument checks before computing, naming the argument


@pytest.fixture
def nothing_computed(monkeypatch):
    from mmaemu.cpu import chunked

    def refuse(*args, **kwargs):
        raise AssertionError("computed before the arguments were checked")

    monkeypatch.setattr(chunked, "accumulate_chunked_codes", refuse)


@pytest.mark.parametrize("recipe", ["abc", True, (1, 128, 128.7), (1, 128), (1, True, 128), [1, 128, "128"]])
def test_a_recipe_that_is_not_three_ints_is_refused_naming_it(nothing_computed, recipe):
    a, b = operands()
    d = torch.zeros((8, 256), dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"^recipe must be None or a tuple of three ints .*recipe=None"):
        dg.fp8_gemm_nt(a, b, d, recipe=recipe)
    with pytest.raises(TypeError, match="^recipe must be"):
        dg.m_grouped_fp8_gemm_nt_masked((a[0][None], a[1][None]), (b[0][None], b[1][None]), d[None],
                                        torch.tensor([8], dtype=torch.int32), 8, recipe=recipe)


def test_a_list_recipe_of_ints_is_accepted():
    a, b = operands()
    d = torch.empty((8, 256), dtype=torch.bfloat16)
    dg.fp8_gemm_nt(a, b, d, recipe=[1, 128, 128])
    assert torch.equal(d.view(torch.int16), cpu_result(a, b).view(torch.int16))


def test_a_meta_output_or_operand_is_refused_naming_it(nothing_computed):
    a, b = operands()
    with pytest.raises(ValueError, match="^d is on the meta device: it has no storage"):
        dg.fp8_gemm_nt(a, b, torch.empty((8, 256), dtype=torch.bfloat16, device="meta"))
    with pytest.raises(ValueError, match="^b scales is on the meta device"):
        dg.fp8_gemm_nt(a, (b[0], b[1].to("meta")), torch.empty((8, 256), dtype=torch.bfloat16))


def test_an_output_whose_elements_share_memory_is_refused_naming_it(nothing_computed):
    a, b = operands()
    row = torch.zeros((1, 256), dtype=torch.bfloat16)
    with pytest.raises(UnsupportedFeatureError, match=r"^d \(shape \(8, 256\), strides \(0, 1\)\) has elements that "
                                                      r"share memory"):
        dg.fp8_gemm_nt(a, b, row.expand(8, 256))
    overlapping = torch.zeros(2048, dtype=torch.bfloat16).as_strided((8, 256), (128, 1))
    with pytest.raises(UnsupportedFeatureError, match="share memory"):
        dg.fp8_gemm_nt(a, b, overlapping)
    assert torch.equal(row, torch.zeros_like(row))


def test_a_padded_output_is_written_row_by_row():
    """Rows apart by more than N (a slice of a wider buffer) share nothing: accepted, as DeepGEMM accepts them."""
    a, b = operands()
    wide = torch.zeros((8, 384), dtype=torch.bfloat16)
    dg.fp8_gemm_nt(a, b, wide[:, :256])
    assert torch.equal(wide[:, :256].view(torch.int16), cpu_result(a, b).view(torch.int16))
    assert not wide[:, 256:].any()


def test_the_block_wise_layer_explains_its_plan():
    """The block-wise layer's explain is its plan's (it used to raise): S = 1 from the kernel, the engine, and a
    refused backend as the validation, never raised."""
    from mmaemu.nn import EmulatedFP8Linear

    layer = EmulatedFP8Linear.from_linear(torch.nn.Linear(256, 128), recipe="blockwise")
    x = torch.randn(4, 256)
    plan = layer.explain(x)
    assert (plan.validation, plan.split.S, plan.split.source, plan.split.verified, plan.backend) == \
        ("ok", 1, "kernel", False, "cpu")
    assert plan.kernel == DEEPGEMM_SM90_1D2D.name and plan.preset == "hopper" and plan.preset_maturity == \
        "experimental"
    layer.backend = "cuda:offset"
    refused = layer.explain(x)
    assert refused.validation[0] == "BackendUnavailableError" and "offset kernel" in refused.validation[1]

"""F.scaled_mm's block-wise form (:func:`mmaemu.blockwise_cublaslt.scaled_mm_blockwise`) chooses its engine by the
rule of every block-wise and block-scaled call (:func:`mmaemu.plan.steps.recipe_engine`): from the call's context
(``MMAEMU_BACKEND``, ``MMAEMU_DISABLE_CUDA``, forced failures, the verdict source) and the kernel registry's choice.

No GPU here, as in tests/test_deepgemm_front_door.py: the device probe answers a fake H100, the engine rule sees the
operands on ``cuda:0``, and the block-wise CUDA kernel is a spy that records each launch and computes with the CPU
reference engine (the bits of ``cuda:simple`` itself are checked under the simulator in tests/test_blockwise.py).
"""

from __future__ import annotations

import pytest
import torch

import mmaemu.blockwise_cublaslt as v2
from mmaemu.cuda.dispatch import gating
from mmaemu.errors import BackendUnavailableError

from test_blockwise_cublaslt import B1, B128, Case
from test_kernel_choice_context import CUDA0, fake_gpu_front_door, verdict_source

pytestmark = [pytest.mark.usefixtures("fresh_dispatcher", "fresh_warnings"),
              pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning")]


def case():
    return Case(16, 256, 32, "e4m3", "e4m3", (B1, B128), seed=5)


def bits(t):
    return t.view(torch.int16)


@pytest.fixture
def on_fake_gpu(monkeypatch):
    """The engine rule sees the operands on cuda:0 of a fake H100 (:func:`fake_gpu_front_door`; ``planned``: each
    call's :class:`mmaemu.plan.steps.RecipeEngine`)."""
    return fake_gpu_front_door(monkeypatch, v2, "recipe_engine",
                               lambda engine, device, backend, context, *, recipe:
                               engine(CUDA0, backend, context, recipe=recipe))


def test_cuda_simple_runs_the_cuda_kernel_where_its_verdict_passes_with_the_same_bits(on_fake_gpu):
    c = case()
    expected = c.v2(torch.bfloat16, backend="cpu")
    on_fake_gpu["verdicts"] = verdict_source({})
    assert torch.equal(bits(c.v2(torch.bfloat16, backend="cuda:simple")), bits(expected))
    assert len(on_fake_gpu["launches"]) == 1
    assert [e.backend for e in on_fake_gpu["planned"]] == ["cpu", "cuda:simple"]


def test_disabled_cuda_never_runs_a_cuda_kernel(on_fake_gpu, monkeypatch):
    c = case()
    expected = c.v2(torch.bfloat16, backend="cpu")
    monkeypatch.setenv("MMAEMU_DISABLE_CUDA", "1")
    on_fake_gpu["verdicts"] = verdict_source({})
    with pytest.raises(BackendUnavailableError, match="disabled by MMAEMU_DISABLE_CUDA"):
        c.v2(torch.bfloat16, backend="cuda:simple")
    monkeypatch.setenv("MMAEMU_BACKEND", "cuda:simple")  # a preference: the cpu engine computes and says why
    assert torch.equal(bits(c.v2(torch.bfloat16)), bits(expected))
    assert on_fake_gpu["launches"] == []
    assert on_fake_gpu["planned"][-1].fallbacks == ("cuda: disabled by MMAEMU_DISABLE_CUDA",)


def test_a_failed_verdict_refuses_the_cuda_kernel(on_fake_gpu, monkeypatch):
    c = case()
    on_fake_gpu["verdicts"] = verdict_source({"simple": False})
    with pytest.raises(BackendUnavailableError, match="cuda:simple: stub says simple fails"):
        c.v2(torch.bfloat16, backend="cuda:simple")
    on_fake_gpu["verdicts"] = verdict_source({})
    monkeypatch.setenv("MMAEMU_TEST_FORCE_FAIL", "simple")
    with pytest.raises(BackendUnavailableError, match="forced to fail by MMAEMU_TEST_FORCE_FAIL"):
        c.v2(torch.bfloat16, backend="cuda:simple")
    assert on_fake_gpu["launches"] == []


def test_mmaemu_backend_replaces_auto(on_fake_gpu, monkeypatch):
    from mmaemu.cpu import chunked

    c = case()
    expected = c.v2(torch.bfloat16, backend="cpu")
    engines = []
    real = chunked.accumulate_chunked_codes

    def spy(*args, reference=False, **options):
        engines.append("reference" if reference else "cpu")
        return real(*args, reference=reference, **options)

    monkeypatch.setattr(chunked, "accumulate_chunked_codes", spy)
    on_fake_gpu["verdicts"] = verdict_source({})
    for variable, launches, engine in (("reference", 0, ["reference"]), ("cuda:simple", 1, []),
                                       ("cuda:offset", 0, ["cpu"])):
        on_fake_gpu["launches"].clear()
        engines.clear()
        monkeypatch.setenv("MMAEMU_BACKEND", variable)
        assert torch.equal(bits(c.v2(torch.bfloat16)), bits(expected)), variable
        assert (len(on_fake_gpu["launches"]), engines) == (launches, engine), variable
    assert on_fake_gpu["planned"][-1].fallbacks == (
        "cuda:offset: block-wise calls run on a CUDA device only with backend='cuda:simple'",)
    monkeypatch.setenv("MMAEMU_BACKEND", "tpu")
    with pytest.raises(ValueError, match=r"unknown backend 'tpu' \(from MMAEMU_BACKEND\)"):
        c.v2(torch.bfloat16)


def test_cpu_tensors_refuse_a_named_cuda_kernel_and_nothing_of_cuda_is_touched(monkeypatch):
    def no_probe(device=None):
        raise AssertionError("the device was probed for CPU tensors")

    monkeypatch.setattr(gating, "_probe", no_probe)
    c = case()
    with pytest.raises(BackendUnavailableError, match="cuda: tensors on cpu"):
        c.v2(torch.bfloat16, backend="cuda:simple")
    with pytest.raises(BackendUnavailableError, match="cannot run a block-wise call"):
        c.v2(torch.bfloat16, backend="cuda:offset")

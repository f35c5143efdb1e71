"""torchao 0.18.0's float8 training under ``mmaemu.patch``: every GEMM of a step routed to mmaemu, none computed by
torch's kernel, each equal to a direct ``mmaemu.scaled_mm`` of the same operands, the loss bit-reproducible (two
runs, one and two threads), and the training audit's roles and split-K evidence of the backward GEMMs.

The GEMMs each recipe issues are read from torchao 0.18.0's source (``torchao/float8/config.py``
``Float8LinearConfig.from_recipe_name``, ``float8_linear.py`` ``matmul_with_hp_or_float8_args``,
``float8_ops.py`` ``addmm_float8_unwrapped``) and counted here by a spy on ``torch._scaled_mm`` without the patch:
per layer and step, "tensorwise" and "rowwise" issue 3 (output, grad_input, grad_weight), "rowwise_with_gw_hp"
2 (its grad_weight is a high-precision torch.mm).
"""

import os
import sys

import pytest
import torch

import mmaemu
from mmaemu.audit_training import audit_step
from mmaemu.cpu import threads

sys.path.insert(0, os.path.dirname(__file__))
from test_block_quantize import _torchao  # noqa: E402  (pins torchao 0.18.0)

RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
GEMMS_PER_LAYER_STEP = {"tensorwise": 3, "rowwise": 3, "rowwise_with_gw_hp": 2}
TOKENS, STEPS, LAYERS = 256, 3, 2
pytestmark = [pytest.mark.usefixtures("fresh_warnings"),
              pytest.mark.filterwarnings("ignore::mmaemu.UnverifiedSplitWarning"),
              pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning")]


@pytest.fixture(scope="module")
def float8():
    """torchao's float8 package: skipped where torchao is not installed, failing where MMAEMU_TEST_REQUIRE_TORCHAO=1
    (the check of tests/test_block_quantize.py, which pins the same version)."""
    _torchao()
    from torchao import float8

    return float8


def mlp(float8, recipe):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    return float8.convert_to_float8_training(model, config=float8.Float8LinearConfig.from_recipe_name(recipe))


def data():
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(TOKENS, 64, generator=generator), torch.randn(TOKENS, 64, generator=generator))
            for _ in range(STEPS)]


def train(model):
    """The loss bits of STEPS SGD steps."""
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for x, target in data():
        loss = torch.nn.functional.mse_loss(model(x), target)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.detach().view(torch.int32).item())
    return losses


def bits(tensor):
    return tensor.view({2: torch.int16, 4: torch.int32}[tensor.itemsize])


def scales(call):
    """(numel of scale_a, numel of scale_b) of a recorded call."""
    args, kwargs, _ = call
    named = dict(zip(("input", "mat2", "scale_a", "scale_b"), args), **kwargs)
    return named["scale_a"].numel(), named["scale_b"].numel()


class Spy:
    """A stand-in for a ``torch._scaled_mm`` that records each call (arguments and result) and calls it."""

    def __init__(self, function):
        self.function, self.calls = function, []

    def __call__(self, *args, **kwargs):
        result = self.function(*args, **kwargs)
        self.calls.append((args, kwargs, result.clone()))  # torchao scales some results in place afterwards
        return result


def patched_run(model, monkeypatch, profile="hopper"):
    """(losses, patch log, calls that reached torch's own function, calls as routed) of a patched training run."""
    native = Spy(torch._scaled_mm)
    monkeypatch.setattr(torch, "_scaled_mm", native)  # what the patch saves and puts back: torch's function
    with mmaemu.patch(profile=profile, splitk="assume-unsplit") as log:
        routed = Spy(torch._scaled_mm)  # wraps the patch's function: sees the operands of every routed call
        torch._scaled_mm = routed
        try:
            losses = train(model)
        finally:
            torch._scaled_mm = routed.function
    return losses, log, native.calls, routed.calls


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_gemm_of_a_step_is_routed_and_equals_a_direct_call(float8, recipe, monkeypatch):
    native_only = Spy(torch._scaled_mm)
    monkeypatch.setattr(torch, "_scaled_mm", native_only)
    train(mlp(float8, recipe))  # no patch: the GEMMs torchao issues, computed by torch's CPU kernel
    issued = len(native_only.calls)
    assert issued == GEMMS_PER_LAYER_STEP[recipe] * LAYERS * STEPS
    monkeypatch.undo()

    losses, log, native, routed = patched_run(mlp(float8, recipe), monkeypatch)
    assert native == []  # none computed by torch's kernel
    assert len(log) == len(routed) == issued and log.dropped == 0
    assert all(record.error is None and record.backend == "cpu" for record in log)
    for args, kwargs, result in routed:
        direct = mmaemu.scaled_mm(*args, **kwargs, profile="hopper", splitk="assume-unsplit")
        assert direct.dtype == result.dtype and torch.equal(bits(direct), bits(result))


def test_each_recipe_issues_the_formats_and_accumulation_of_its_config(float8, monkeypatch):
    """torchao 0.18.0: output E4M3 x E4M3 fast; tensorwise gradients E5M2 (the default grad_output dtype) slow;
    rowwise gradients E4M3 slow, sent with one-element scales (addmm_float8_unwrapped moves row-wise scales of a
    slow GEMM into a post-multiplication)."""
    for recipe, grad_format in (("tensorwise", "float8_e5m2"), ("rowwise", "float8_e4m3fn"),
                                ("rowwise_with_gw_hp", "float8_e4m3fn")):
        _, log, _, routed = patched_run(mlp(float8, recipe), monkeypatch)
        monkeypatch.undo()
        per_step = GEMMS_PER_LAYER_STEP[recipe] * LAYERS
        first_step = list(zip(log, routed))[:per_step]
        forward = [(r, call) for r, call in first_step if r.use_fast_accum]
        backward = [(r, call) for r, call in first_step if not r.use_fast_accum]
        assert len(forward) == LAYERS and len(backward) == per_step - LAYERS
        assert all((r.input_dtype, r.mat2_dtype) == ("float8_e4m3fn", "float8_e4m3fn") for r, _ in forward)
        assert all((r.input_dtype, r.mat2_dtype) == (grad_format, "float8_e4m3fn") for r, _ in backward)
        if recipe != "tensorwise":
            assert all(scales(call) == (1, 1) for _, call in backward)
            assert all(scales(call) == (TOKENS, r.mat2_shape[1]) for r, call in forward)  # row-wise scales


@pytest.mark.parametrize("recipe", RECIPES)
def test_loss_bits_repeat_across_runs_and_thread_counts(float8, recipe, monkeypatch):
    runs = []
    for count in (2, 1, 2):
        monkeypatch.setattr(threads, "num_threads", lambda count=count: count)
        runs.append(patched_run(mlp(float8, recipe), monkeypatch)[0])
        monkeypatch.undo()
    assert runs[0] == runs[1] == runs[2]
    if recipe == "tensorwise":
        ada = patched_run(mlp(float8, recipe), monkeypatch, profile="ada")[0]
        assert ada != runs[0]  # the profiles' accumulations differ: the test can tell runs apart
    else:  # the row-wise forward on sm_89 is a kernel mmaemu does not model: refused, not approximated
        with pytest.raises(mmaemu.UnsupportedFeatureError, match="row-wise scaling: on sm_89"):
            patched_run(mlp(float8, recipe), monkeypatch, profile="ada")


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_audit_lists_both_passes_with_roles_and_split_evidence(float8, recipe):
    tokens = 1024  # grad_weight's K: inside the H100 table's recorded K range
    model = mlp(float8, recipe)
    audit = audit_step(model, torch.randn(tokens, 64), profile="hopper")
    roles = {"output": LAYERS, "grad_input": LAYERS}
    if recipe != "rowwise_with_gw_hp":
        roles["grad_weight"] = LAYERS
    assert audit.by_role() == roles
    for gemm in audit:
        layer = dict(model.named_modules())[gemm.layer]
        expected = {"output": (tokens, layer.out_features, layer.in_features),
                    "grad_input": (tokens, layer.in_features, layer.out_features),
                    "grad_weight": (layer.out_features, layer.in_features, tokens)}[gemm.role]
        assert (gemm.M, gemm.N, gemm.K) == expected
        assert gemm.fast == (gemm.role == "output")
    for gemm in audit:
        if gemm.role == "grad_weight":  # K = tokens = 1024, in the recorded table: decided by evidence
            assert gemm.source == "table" and gemm.verified and gemm.status == "verified"
        elif recipe != "tensorwise" and gemm.role == "output":  # the row-wise (CUTLASS) kernel never splits
            assert gemm.source == "kernel" and gemm.S == 1
        else:  # K = 64 or 128: below the table's K range, undecided under "auto" (computed with S = 1)
            assert gemm.status == "undecided" and gemm.S == 1
    assert all(p.grad is not None for p in model.parameters())

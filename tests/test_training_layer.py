"""``mmaemu.nn_training.TrainableFP8Linear`` and ``mmaemu.delayed_scaling``: Transformer Engine's FP8 training
recipe (TE commit d0067d0d: DelayedScaling / Float8CurrentScaling, fprop E4M3 fast, dgrad and wgrad with E5M2
gradients and split accumulation), each GEMM against a direct ``mmaemu.scaled_mm`` and one against the oracle.

The expected scales are derived here with exact fractions (tests/oracle.py's fp32 rounding), not with the
package's fp32 helpers.
"""

import os
import sys
from fractions import Fraction

import pytest
import torch

import mmaemu
from mmaemu import delayed_scaling
from mmaemu.audit_training import audit_step
from mmaemu.cpu import threads
from mmaemu.nn_training import (FUSED_WGRAD_PROBE, ExperimentalRecipeWarning, TrainableFP8Linear, TrainingRecipe,
                                convert_for_training)

sys.path.insert(0, os.path.dirname(__file__))
import oracle  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.usefixtures("fresh_warnings"),
              pytest.mark.filterwarnings("ignore::mmaemu.nn_training.ExperimentalRecipeWarning")]


def f32_bits(value: float) -> int:
    value = value.detach().reshape(()).float() if isinstance(value, torch.Tensor) else torch.tensor(value,
                                                                                                 dtype=torch.float32)
    return value.view(torch.int32).item() & 0xFFFFFFFF


def fraction_of(value: float) -> Fraction:
    return Fraction(float(value))


def te_scale_bits(fp8_max: int, amax: float) -> int:
    """fp32(fp8_max / amax), rounded once (IEEE division), from exact fractions."""
    return oracle.round_fp32(Fraction(fp8_max) / fraction_of(amax))


def inverse_bits(scale_bits: int) -> int:
    return oracle.round_fp32(1 / oracle.fp32_value(scale_bits))


# ----------------------------------------------------------------------------------------------------------------
# The scale update (delayed_scaling.cu kernel_bulk)


def state_of(history, scale=1.0):
    h = torch.tensor(history, dtype=torch.float32)
    s = torch.tensor(scale, dtype=torch.float32)
    return delayed_scaling.DelayedState(h, s, torch.tensor(1 / scale, dtype=torch.float32))


def test_update_rolls_the_history_and_takes_its_max():
    new = delayed_scaling.update(state_of([3.0, 5.0, 0.5, 2.0]), "e4m3")
    assert new.history.tolist() == [0.0, 0.5, 2.0, 3.0]  # new[i] = old[i + 1], new[L-1] = last, new[0] = 0
    assert f32_bits(new.scale) == te_scale_bits(448, 5.0)  # max over the whole old history
    assert f32_bits(new.scale_inv) == inverse_bits(te_scale_bits(448, 5.0))
    recent = delayed_scaling.update(state_of([3.0, 5.0, 0.5, 2.0]), "e5m2", amax_compute_algo="most_recent")
    assert f32_bits(recent.scale) == te_scale_bits(57344, 3.0)
    margin = delayed_scaling.update(state_of([7.0, 0.0]), "e4m3", margin=1)
    assert f32_bits(margin.scale) == te_scale_bits(224, 7.0)


def test_update_without_a_new_amax_keeps_history_and_scale():
    new = delayed_scaling.update(state_of([0.0, 9.0, 4.0], scale=2.5), "e4m3")
    assert new.history.tolist() == [0.0, 9.0, 4.0] and float(new.scale) == 2.5
    infinite = delayed_scaling.update(state_of([float("inf"), 1.0], scale=0.75), "e4m3")
    assert float(infinite.scale) == 0.75 and infinite.history.tolist() == [0.0, float("inf")]
    tiny = delayed_scaling.update(state_of([1e-45, 0.0]), "e5m2")  # 57344 / 2**-149 overflows fp32
    assert f32_bits(tiny.scale) == 0x7F7FFFFF
    single = delayed_scaling.update(state_of([6.0]), "e4m3")
    assert single.history.tolist() == [0.0] and f32_bits(single.scale) == te_scale_bits(448, 6.0)


def test_update_refuses_what_te_does_not_name():
    with pytest.raises(ValueError, match="amax_compute_algo"):
        delayed_scaling.update(state_of([1.0]), "e4m3", amax_compute_algo="mean")
    with pytest.raises(ValueError, match="amax_history_len"):
        delayed_scaling.initial_state(0)


# ----------------------------------------------------------------------------------------------------------------
# The layer


def layer_and_data(recipe=None, steps=3, tokens=64, bias=True, profile="hopper"):
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 48, bias=bias)
    layer = TrainableFP8Linear.from_linear(linear, recipe=recipe, profile=profile, splitk="assume-unsplit")
    generator = torch.Generator().manual_seed(3)
    data = [(torch.randn(tokens, 32, generator=generator) * (1 + i), torch.randn(tokens, 48, generator=generator))
            for i in range(steps)]
    return layer, data


def train(layer, data, calls=None):
    """SGD steps; the GEMM calls of each step (a list per step) when ``calls`` is a list."""
    optimiser = torch.optim.SGD(layer.parameters(), lr=0.01)
    for x, target in data:
        x = x.clone().requires_grad_(True)
        step = []
        layer.gemm_observer = step.append
        loss = torch.nn.functional.mse_loss(layer(x), target)
        optimiser.zero_grad()
        loss.backward()
        if calls is not None:
            calls.append((step, x, layer.weight.grad.clone()))
        optimiser.step()
    layer.gemm_observer = None
    return [p.detach().clone() for p in layer.parameters()]


def direct(call):
    return mmaemu.scaled_mm(call.a, call.b, call.scale_a, call.scale_b, out_dtype=call.out_dtype,
                            use_fast_accum=call.use_fast_accum, profile="hopper", splitk="assume-unsplit")


@pytest.mark.filterwarnings("ignore::mmaemu.UnverifiedSplitWarning")
def test_each_step_runs_three_gemms_as_te_does_each_equal_to_a_direct_call():
    layer, data = layer_and_data()
    calls = []
    train(layer, data, calls)
    for step, x, grad_weight in calls:
        assert [c.role for c in step] == ["output", "grad_input", "grad_weight"]
        output, dgrad, wgrad = step
        assert (output.a.dtype, output.b.dtype, output.use_fast_accum) == (torch.float8_e4m3fn,
                                                                           torch.float8_e4m3fn, True)
        assert (dgrad.a.dtype, dgrad.b.dtype, dgrad.use_fast_accum) == (torch.float8_e5m2, torch.float8_e4m3fn,
                                                                        False)
        assert (wgrad.a.dtype, wgrad.b.dtype, wgrad.use_fast_accum) == (torch.float8_e5m2, torch.float8_e4m3fn,
                                                                        False)
        assert tuple(wgrad.a.shape) == (48, 64) and tuple(wgrad.b.shape) == (64, 32)  # K = tokens
        assert wgrad.out_dtype == torch.float32 and dgrad.out_dtype == torch.float32
        for call in step:
            assert torch.equal(direct(call).view(torch.int32), call.result.view(torch.int32))
        assert torch.equal(grad_weight.view(torch.int32), wgrad.result.view(torch.int32))
        assert torch.equal(x.grad.view(torch.int32), dgrad.result.view(torch.int32))
        # the same FP8 codes feed dgrad (weight) and wgrad (input) as the forward: TE's saved FP8 copies
        assert torch.equal(dgrad.b.view(torch.uint8), output.b.t().view(torch.uint8))
        assert torch.equal(wgrad.b.view(torch.uint8), output.a.view(torch.uint8))


@pytest.mark.filterwarnings("ignore::mmaemu.UnverifiedSplitWarning")
def test_delayed_scaling_casts_with_the_scale_of_earlier_steps():
    layer, data = layer_and_data()
    calls = []
    train(layer, data, calls)
    amaxes = [float(x.abs().max()) for x, _ in data]  # the inputs grow: each step's amax is the history's max
    for index, (step, _, _) in enumerate(calls):
        scale_bits = 0x3F800000 if index == 0 else te_scale_bits(448, amaxes[index - 1])
        assert f32_bits(step[0].scale_a) == inverse_bits(scale_bits)
        expected_codes = mmaemu.quantize.quantize(data[index][0], oracle.fp32_value(scale_bits), "e4m3")
        assert torch.equal(step[0].a.view(torch.uint8), expected_codes.view(torch.uint8))
    assert layer.amax_history_input[0] == 0 and layer.amax_history_input[-1] == amaxes[-1]


@pytest.mark.filterwarnings("ignore::mmaemu.UnverifiedSplitWarning")
def test_the_weight_is_quantised_again_at_every_forward():
    layer, data = layer_and_data(recipe=TrainingRecipe.current())
    calls = []
    train(layer, data, calls)
    codes = [step[0].b.t().contiguous().view(torch.uint8) for step, _, _ in calls]
    assert not torch.equal(codes[0], codes[1]) and not torch.equal(codes[1], codes[2])


@pytest.mark.filterwarnings("ignore::mmaemu.UnverifiedSplitWarning")
def test_current_scaling_scales_every_tensor_by_its_own_amax():
    layer, data = layer_and_data(recipe=TrainingRecipe.current())
    calls = []
    weight_before = layer.weight.detach().clone()
    train(layer, data[:1], calls)
    (output, dgrad, _), x, _ = calls[0]
    assert f32_bits(output.scale_a) == inverse_bits(te_scale_bits(448, float(x.detach().abs().max())))
    assert f32_bits(output.scale_b) == inverse_bits(te_scale_bits(448, float(weight_before.abs().max())))
    # amax(dy) * fp32(57344 / amax(dy)) is within an fp32 ulp of 57344: its E5M2 code is the format's largest
    assert dgrad.a.dtype == torch.float8_e5m2 and float(dgrad.a.float().abs().max()) == 57344.0
    assert not hasattr(layer, "amax_history_input")  # no history under current scaling


@pytest.mark.filterwarnings("ignore::mmaemu.UnverifiedSplitWarning")
def test_one_backward_equals_the_oracle():
    """A 16-token step on 16 x 16: grad_weight and grad_input against tests/oracle.py's scaled_mm (hopper)."""
    torch.manual_seed(5)
    layer = TrainableFP8Linear(16, 16, bias=False, profile="hopper", splitk=1)
    x = (torch.randn(16, 16) * 3).requires_grad_(True)
    step = []
    layer.gemm_observer = step.append
    (layer(x) * torch.randn(16, 16)).sum().backward()
    for call in step:
        a_rows = call.a.contiguous().view(torch.uint8).tolist()
        w_rows = call.b.t().contiguous().view(torch.uint8).tolist()
        fmt = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
        expected = oracle.scaled_mm(a_rows, w_rows, fmt[call.a.dtype], fmt[call.b.dtype], f32_bits(call.scale_a),
                                    f32_bits(call.scale_b), "float32", oracle.PRESETS["hopper"],
                                    call.use_fast_accum)
        got = [[v & 0xFFFFFFFF for v in row] for row in call.result.view(torch.int32).tolist()]
        assert got == expected, call.role
    assert [c.role for c in step] == ["output", "grad_input", "grad_weight"]


@pytest.mark.filterwarnings("ignore::mmaemu.UnverifiedSplitWarning")
def test_training_is_bit_reproducible_across_runs_and_thread_counts(monkeypatch):
    results = []
    for count in (2, 1, 2):
        monkeypatch.setattr(threads, "num_threads", lambda count=count: count)
        layer, data = layer_and_data(tokens=256)
        results.append(train(layer, data))
    for run in results[1:]:
        assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(results[0], run))
    layer, data = layer_and_data(tokens=256, profile="ada")
    ada = train(layer, data)
    assert not all(torch.equal(a, b) for a, b in zip(results[0], ada))  # the test can tell profiles apart


def test_fused_wgrad_accumulation_is_refused_with_the_way_out_and_the_probe():
    with pytest.raises(mmaemu.UnsupportedFeatureError, match="leave it False") as caught:
        TrainableFP8Linear(16, 16, fuse_wgrad_accumulation=True)
    assert FUSED_WGRAD_PROBE in str(caught.value)
    with open(os.path.join(ROOT, "docs", "limitations.md"), encoding="utf-8") as handle:
        limitations = handle.read()
    assert "fuse_wgrad_accumulation" in limitations and "beta = 1" in limitations


@pytest.mark.filterwarnings("default::mmaemu.nn_training.ExperimentalRecipeWarning")
def test_the_modelled_recipe_warns_that_it_is_experimental():
    with pytest.warns(ExperimentalRecipeWarning, match="modelled from TE's source"):
        TrainableFP8Linear(16, 16, recipe=TrainingRecipe(margin=2))


def test_recipe_refuses_what_is_not_modelled():
    with pytest.raises(ValueError, match="no margin"):
        TrainingRecipe(scaling="current", margin=1)
    with pytest.raises(ValueError, match="callable is not modelled"):
        TrainingRecipe(amax_compute_algo=max)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        TrainableFP8Linear(16, 16, dtype=torch.float16)


@pytest.mark.filterwarnings("ignore::mmaemu.UnverifiedSplitWarning")
def test_audit_lists_the_layers_gemms_of_both_passes():
    torch.manual_seed(0)
    model = convert_for_training(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                                     torch.nn.Linear(128, 64)), profile="hopper")
    audit = audit_step(model, torch.randn(1024, 64))
    rows = [(g.layer, g.role, g.M, g.N, g.K, g.a, g.b, g.fast) for g in audit]
    assert rows == [("0", "output", 1024, 128, 64, "e4m3", "e4m3", True),
                    ("2", "output", 1024, 64, 128, "e4m3", "e4m3", True),
                    ("2", "grad_input", 1024, 128, 64, "e5m2", "e4m3", False),
                    ("2", "grad_weight", 64, 128, 1024, "e5m2", "e4m3", False),
                    ("0", "grad_weight", 128, 64, 1024, "e5m2", "e4m3", False)]  # no dgrad: x needs no grad
    statuses = {(g.layer, g.role): g.status for g in audit}
    assert statuses[("2", "grad_weight")] == statuses[("0", "grad_weight")] == "verified"
    assert statuses[("0", "output")] == "undecided" and len(audit.undecided) == 3
    assert all(m.splitk == "auto" and m.gemm_observer is None for m in model if isinstance(m, TrainableFP8Linear))
    assert "grad_weight" in str(audit) and "undecided" in audit.summary()

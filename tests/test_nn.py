"""mmaemu.nn.EmulatedFP8Linear: the layer equals its recipe (TE-style quantisation + mmaemu.scaled_mm + bias)."""

import pytest
import torch

import mmaemu
from mmaemu.errors import SplitKUnknownError, UnsupportedFeatureError
from mmaemu.nn import EmulatedFP8Linear, convert_linears
from mmaemu.quantize import amax_scale, quantize_e4m3, scale_inv
from mmaemu.testing import assert_bitwise_equal

IN, OUT = 64, 32


def linear(seed=0, bias=True, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Linear(IN, OUT, bias=bias).to(dtype)


def inputs(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2


def by_hand(x, lin, *, profile="hopper", out_dtype=torch.float32, input_scale=None, fast=True):
    """The documented recipe, written out: quantise, scaled_mm with the inverse scales, then + bias."""
    x2 = x.reshape(-1, IN)
    s_w = amax_scale(lin.weight.detach())
    s_x = amax_scale(x2) if input_scale is None else torch.tensor(input_scale, dtype=torch.float32)
    y = mmaemu.scaled_mm(quantize_e4m3(x2, s_x), quantize_e4m3(lin.weight.detach(), s_w).t(), scale_inv(s_x),
                         scale_inv(s_w), out_dtype=out_dtype, use_fast_accum=fast, profile=profile, splitk=1)
    if lin.bias is not None:
        y = y + lin.bias.detach().to(out_dtype)
    return y.reshape(*x.shape[:-1], OUT)


@pytest.mark.parametrize("profile", ["hopper", "ada"])
def test_from_linear_equals_the_recipe_with_leading_dims(profile):
    lin = linear()
    layer = EmulatedFP8Linear.from_linear(lin, profile=profile, splitk=1)
    x = inputs(2, 3, IN)
    with torch.no_grad():
        y = layer(x)
    assert y.shape == (2, 3, OUT) and y.dtype == torch.float32  # the input's dtype, as te.Linear returns
    assert_bitwise_equal(y, by_hand(x, lin, profile=profile))


def test_the_output_has_the_input_dtype_unless_out_dtype_is_given():
    lin = linear(6)
    default = EmulatedFP8Linear.from_linear(lin, splitk=1)
    fixed = EmulatedFP8Linear.from_linear(lin, splitk=1, out_dtype=torch.bfloat16)
    assert default.bias.dtype == torch.float32 and fixed.bias.dtype == torch.bfloat16
    x = inputs(4, IN)
    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            xd = x.to(dtype)
            y = default(xd)
            assert y.dtype == dtype
            assert_bitwise_equal(y, by_hand(xd, lin, out_dtype=dtype))
            assert default.explain(xd).validation == "ok"
            assert_bitwise_equal(fixed(xd), by_hand(xd, lin, out_dtype=torch.bfloat16))
    assert "out_dtype=input" in repr(default) and "out_dtype=bfloat16" in repr(fixed)


def test_profiles_differ_and_each_is_deterministic():
    lin = linear(3, bias=False)
    x = inputs(8, IN, seed=4) * torch.exp2(torch.randint(-6, 6, (8, IN), generator=torch.Generator().manual_seed(5)))
    with torch.no_grad():
        hopper = EmulatedFP8Linear.from_linear(lin, profile="hopper", splitk=1, out_dtype=torch.float32)(x)
        ada = EmulatedFP8Linear.from_linear(lin, profile="ada", splitk=1, out_dtype=torch.float32)(x)
        again = EmulatedFP8Linear.from_linear(lin, profile="ada", splitk=1, out_dtype=torch.float32)(x)
    assert_bitwise_equal(ada, again)
    assert not torch.equal(hopper.view(torch.int32), ada.view(torch.int32))  # 32- vs 16-product blocks


def test_static_input_scale_and_slow_accumulation_and_fp32_output():
    lin = linear(2)
    x = inputs(5, IN)
    layer = EmulatedFP8Linear.from_linear(lin, input_scale=10.0, use_fast_accum=False, out_dtype=torch.float32,
                                          splitk=1)
    assert float(layer.input_scale_inv) == float(scale_inv(torch.tensor(10.0)))
    with torch.no_grad():
        assert_bitwise_equal(layer(x), by_hand(x, lin, out_dtype=torch.float32, input_scale=10.0, fast=False))


def test_bias_is_added_after_the_gemm_in_the_output_dtype():
    lin = linear(4)
    x = inputs(3, IN)
    with_bias = EmulatedFP8Linear.from_linear(lin, splitk=1, out_dtype=torch.bfloat16)
    lin_nobias = torch.nn.Linear(IN, OUT, bias=False)
    lin_nobias.weight = lin.weight
    without = EmulatedFP8Linear.from_linear(lin_nobias, splitk=1, out_dtype=torch.bfloat16)
    with torch.no_grad():
        assert_bitwise_equal(with_bias(x), without(x) + lin.bias.detach().to(torch.bfloat16))
    assert with_bias.bias.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="FP8 out_dtype"):
        EmulatedFP8Linear.from_linear(lin, out_dtype=torch.float8_e4m3fn)


def test_the_bias_is_added_after_the_gemm_by_torch():
    """The layer's output with a bias is the output without it plus the bias, torch's fp32 addition bit for bit,
    also on a NaN row of the GEMM."""
    x = inputs(3, IN)
    lin = linear(4)
    with_bias = EmulatedFP8Linear.from_linear(lin, splitk=1, out_dtype=torch.float32)
    lin_nobias = torch.nn.Linear(IN, OUT, bias=False)
    lin_nobias.weight = lin.weight
    without = EmulatedFP8Linear.from_linear(lin_nobias, splitk=1, out_dtype=torch.float32)
    x[0, 0] = float("inf")  # a NaN row of the GEMM (inf times zero weights, or an inf amax)
    with torch.no_grad():
        assert_bitwise_equal(with_bias(x), without(x) + lin.bias.detach())


def test_padding_m_changes_what_the_split_k_lookup_sees_not_the_rows():
    # (M=16, N=64, K=256, bf16, fast) is a recorded RTX 4060 key; M=14 is not, and is far below the envelope.
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 64, bias=False)
    x = torch.randn(14, 256)
    padded = EmulatedFP8Linear.from_linear(lin, profile="ada", pad_m_to=16)
    plain = EmulatedFP8Linear.from_linear(lin, profile="ada")
    plan = padded.explain(x)
    assert plan.validation == "ok" and plan.split.source == "table" and plan.split.S == 1
    assert plain.explain(x).validation[0] == "SplitKUnknownError"
    with torch.no_grad():
        y = padded(x)
        with pytest.raises(SplitKUnknownError):
            plain(x)
        unpadded_unsplit = EmulatedFP8Linear.from_linear(lin, profile="ada", splitk=1)(x)
    assert y.shape == (14, 64)
    assert_bitwise_equal(y, unpadded_unsplit)  # zero rows do not touch the other rows' arithmetic


def test_from_fp8_state_with_scale_or_scale_inv():
    lin = linear(5)
    s_w = amax_scale(lin.weight.detach())
    w_fp8 = quantize_e4m3(lin.weight.detach(), s_w)
    x = inputs(4, IN)
    a = EmulatedFP8Linear.from_fp8_state(w_fp8, weight_scale_inv=scale_inv(s_w), bias=lin.bias, splitk=1)
    b = EmulatedFP8Linear.from_fp8_state(w_fp8, weight_scale=s_w, bias=lin.bias, splitk=1)
    with torch.no_grad():
        assert_bitwise_equal(a(x), by_hand(x, lin))
        assert_bitwise_equal(b(x), by_hand(x, lin))
    with pytest.raises(ValueError, match="exactly one"):
        EmulatedFP8Linear.from_fp8_state(w_fp8, weight_scale=s_w, weight_scale_inv=scale_inv(s_w))
    with pytest.raises(ValueError, match="exactly one"):
        EmulatedFP8Linear.from_fp8_state(w_fp8)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        EmulatedFP8Linear.from_fp8_state(lin.weight, weight_scale=1.0)
    with pytest.raises(TypeError, match="float32"):
        EmulatedFP8Linear.from_fp8_state(w_fp8, weight_scale_inv=torch.tensor(1.0, dtype=torch.float64))


def test_inference_only():
    lin = linear()
    layer = EmulatedFP8Linear.from_linear(lin, splitk=1)
    assert list(layer.parameters()) == []
    x = inputs(2, IN).requires_grad_()
    with pytest.raises(UnsupportedFeatureError, match="inference-only"):
        layer(x)
    with torch.no_grad():
        layer(x)
    with torch.inference_mode():
        layer(x.detach())


def test_dtype_conversions_keep_buffers_and_state_dict_round_trips():
    layer = EmulatedFP8Linear.from_linear(linear(), splitk=1, out_dtype=torch.bfloat16)
    layer.to(torch.float16).half().bfloat16().float()
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight_scale_inv.dtype == torch.float32
    assert layer.bias.dtype == torch.bfloat16
    state = layer.state_dict()
    other = EmulatedFP8Linear.from_linear(linear(9), splitk=1, out_dtype=torch.bfloat16)
    other.load_state_dict(state)
    x = inputs(3, IN)
    with torch.no_grad():
        assert_bitwise_equal(other(x), layer(x))


def test_arguments_are_checked():
    lin = linear()
    with pytest.raises(KeyError, match="unknown profile"):
        EmulatedFP8Linear.from_linear(lin, profile="rtx5090")
    with pytest.raises(ValueError, match="pad_m_to"):
        EmulatedFP8Linear.from_linear(lin, pad_m_to=0)
    layer = EmulatedFP8Linear.from_linear(lin, splitk=1)
    with pytest.raises(ValueError, match=r"\[\.\.\., 64\]"):
        with torch.no_grad():
            layer(torch.zeros(2, 63))
    assert "profile='hopper'" in repr(layer) and "current (per call)" in repr(layer)


def test_convert_linears_replaces_every_linear():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(IN, IN), torch.nn.ReLU(), torch.nn.Linear(IN, OUT))
    reference = [m for m in model if isinstance(m, torch.nn.Linear)]
    convert_linears(model, profile="ada", splitk=1, include=lambda name, m: m.out_features == OUT)
    assert isinstance(model[0], torch.nn.Linear) and isinstance(model[2], EmulatedFP8Linear)
    assert model[2].profile == "ada"
    x = inputs(4, IN)
    with torch.no_grad():
        y = model(x)
    hidden = torch.relu(reference[0](x))
    with torch.no_grad():
        assert_bitwise_equal(y, by_hand(hidden, reference[1], profile="ada"))


@pytest.mark.parametrize("options, error, match", [
    ({"backend": "bogus"}, ValueError, "unknown backend 'bogus'"),
    ({"backend": 3}, TypeError, "backend must be a string"),
    ({"splitk": "bad"}, TypeError, "splitk must be"),
    ({"splitk": 0}, ValueError, "splitk must be >= 1"),
    ({"splitk": (2, "nonsense")}, ValueError, "nonsense"),
], ids=["unknown-backend", "backend-type", "splitk-type", "splitk-zero", "splitk-scheme"])
def test_bad_splitk_or_backend_is_refused_at_construction_and_named(options, error, match):
    """Both are checked when the layer is built, each with its own error (a bad backend used to surface at the first
    forward, as a split-K problem)."""
    lin = linear()
    with pytest.raises(error, match=match) as info:
        EmulatedFP8Linear.from_linear(lin, **options)
    assert not isinstance(info.value, SplitKUnknownError)
    w_fp8 = quantize_e4m3(lin.weight.detach(), amax_scale(lin.weight.detach()))
    with pytest.raises(error, match=match):
        EmulatedFP8Linear.from_fp8_state(w_fp8, weight_scale=1.0, **options)
    model = torch.nn.Sequential(linear(), torch.nn.ReLU())
    with pytest.raises(error, match=match):
        convert_linears(model, **options)
    assert isinstance(model[0], torch.nn.Linear)  # nothing replaced


def test_valid_backends_and_splits_construct():
    lin = linear()
    for backend in ("cpu", "reference", "cuda", "cuda:simple"):
        assert EmulatedFP8Linear.from_linear(lin, backend=backend, splitk=1).backend == backend
    for splitk in ("auto", 1, (2, "contiguous"), mmaemu.SplitK(3, "contiguous")):
        assert EmulatedFP8Linear.from_linear(lin, splitk=splitk).splitk == splitk

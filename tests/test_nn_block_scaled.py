"""``recipe="mxfp8"`` / ``"mxfp4"`` / ``"nvfp4"`` inside a model: torchao 0.18.0's casts (mmaemu.block_quantize)
and the block-scaled ``scaled_mm`` on the B200 profile, layer by layer."""

from __future__ import annotations

import warnings

import pytest
import torch

import mmaemu
from mmaemu import block_quantize, scale_layout, warn
from mmaemu.errors import ExperimentalPresetWarning, UnsupportedFeatureError

PROFILE = "b200-mx-experimental"


def _model(dtype, seed=3):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32, bias=False))
    return model.to(dtype)


def _quiet():
    context = warnings.catch_warnings()
    context.__enter__()
    warnings.simplefilter("ignore", ExperimentalPresetWarning)
    return context


def _bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


MX_LAYERS = [("mxfp8", "e4m3", 128, "MXFP8Linear"), ("mxfp4", "e2m1", 96, "MXFP4Linear")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe,fmt,K,layer_class", MX_LAYERS, ids=[r[0] for r in MX_LAYERS])
def test_mx_layers_are_the_casts_and_the_block_scaled_gemm(dtype, recipe, fmt, K, layer_class):
    """torchao's MX cast (E4M3, or E2M1 for MXFP4), the block-scaled GEMM in bf16 (torchao's _scaled_mm /
    F.scaled_mm call), the bias added in bf16; MXFP4 at in_features = 96 needs the zero-padded last kind::mxf4
    instruction."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(K, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32, bias=False))
    model = model.to(dtype)
    x = torch.randn(7, K, dtype=dtype) * 3
    first = model[0]
    qw = block_quantize.quantize_mx(first.weight.detach(), fmt, swizzle=True)
    qx = block_quantize.quantize_mx(x, fmt, swizzle=True)
    context = _quiet()
    try:
        gemm = mmaemu.scaled_mm(qx.codes, qw.codes.t(), qx.scales, qw.scales, out_dtype=torch.bfloat16,
                                profile=PROFILE, splitk=1)
        want = (gemm + first.bias.detach().to(torch.bfloat16)).to(dtype)
        mmaemu.nn.convert_linears(model, recipe=recipe)
        assert type(model[0]).__name__ == layer_class and model[0].recipe == recipe
        assert model[0].weight.dtype == qw.codes.dtype and model[0].weight.shape == qw.codes.shape
        with torch.no_grad():
            got = model[0](x)
            assert got.dtype == dtype and torch.equal(_bits(got), _bits(want))
            assert model(x).shape == (7, 32)
            assert model[0].explain(x).kernel.startswith("cuBLASLt block-scaled")
    finally:
        context.__exit__(None, None, None)


@pytest.mark.parametrize("recipe,K", [("mxfp8", 128), ("mxfp4", 96)])
def test_mx_layers_are_exact_where_every_step_is(recipe, K):
    """Entries in {-1, 0, 1} with a 1 in every block: each cast is exact (MXFP4: scale 2**-2, elements 0, +-4; K = 96
    needs the zero-padded last kind::mxf4 instruction), every dot product and bias sum is a small integer, so the
    layer returns x W^T + b exactly (derived, not recomputed)."""
    generator = torch.Generator().manual_seed(5)
    w = torch.randint(-1, 2, (64, K), generator=generator).float()
    x = torch.randint(-1, 2, (6, K), generator=generator).float()
    w[:, ::32], x[:, ::32] = 1.0, -1.0
    linear = torch.nn.Linear(K, 64)
    with torch.no_grad():
        linear.weight.copy_(w)
        linear.bias.copy_(torch.randint(-8, 9, (64,), generator=generator).float())
    context = _quiet()
    try:
        layer = mmaemu.nn.EmulatedFP8Linear.from_linear(linear, recipe=recipe)
        with torch.no_grad():
            assert torch.equal(layer(x), x @ w.t() + linear.bias)
    finally:
        context.__exit__(None, None, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_layer_is_torchaos_dispatch(dtype):
    """torchao 0.18.0's _addmm_nvfp4_dispatch: the GEMM in the input's dtype without global scales, times
    fp32(g_x * g_w) in that dtype, plus the bias in that dtype."""
    model = _model(dtype, seed=4)
    x = torch.randn(5, 128, dtype=dtype)
    first = model[0]
    qw = block_quantize.quantize_nvfp4(first.weight.detach(), swizzle=True)
    qx = block_quantize.quantize_nvfp4(x, swizzle=True)
    context = _quiet()
    try:
        gemm = mmaemu.scaled_mm(qx.codes, qw.codes.t(), qx.scales, qw.scales, out_dtype=dtype, profile=PROFILE,
                                splitk=1)
        global_product = torch.tensor(qx.global_scale) * torch.tensor(qw.global_scale)
        want = gemm * global_product.to(dtype) + first.bias.detach().to(dtype)
        mmaemu.nn.convert_linears(model, recipe="nvfp4")
        assert type(model[0]).__name__ == "NVFP4Linear"
        assert model[0].weight.dtype == torch.float4_e2m1fn_x2 and model[0].weight.shape == (64, 64)
        assert model[0].weight_global_scale.item() == qw.global_scale
        with torch.no_grad():
            got = model[0](x)
            assert got.dtype == dtype and torch.equal(_bits(got), _bits(want))
            # Close to the float product: NVFP4 keeps about one significant bit per element.
            reference = (x.float() @ first.weight.detach().float().t() + first.bias.detach().float())
            assert (got.float() - reference).abs().max() < 0.25 * reference.abs().max()
    finally:
        context.__exit__(None, None, None)


def test_conversion_warns_that_the_recipe_is_experimental():
    warn.reset()
    with pytest.warns(ExperimentalPresetWarning, match="recipe='nvfp4' is experimental"):
        mmaemu.nn.EmulatedFP8Linear.from_linear(torch.nn.Linear(64, 16), recipe="nvfp4")


def test_block_scaled_recipes_refuse_what_they_do_not_take():
    make = mmaemu.nn.EmulatedFP8Linear.from_linear
    context = _quiet()
    try:
        for recipe in ("mxfp8", "mxfp4", "nvfp4"):
            linear = torch.nn.Linear(128, 16)
            with pytest.raises(UnsupportedFeatureError, match="input_scale"):
                make(linear, recipe=recipe, input_scale=torch.tensor(1.0))
            with pytest.raises(UnsupportedFeatureError, match="split-K"):
                make(linear, recipe=recipe, splitk=(2, "contiguous"))
            with pytest.raises(UnsupportedFeatureError, match="multiple of"):
                make(torch.nn.Linear(48, 16), recipe=recipe)
            with pytest.raises(UnsupportedFeatureError):
                make(linear, recipe=recipe, out_dtype=torch.float16)
            layer = make(linear, recipe=recipe)
            with pytest.raises(UnsupportedFeatureError, match="float32 or bfloat16"):
                layer(torch.randn(2, 128, dtype=torch.float16))
            with pytest.raises(UnsupportedFeatureError, match="inference-only"):
                layer(torch.randn(2, 128, requires_grad=True))
            with pytest.raises(UnsupportedFeatureError, match="use profile='b200-mx-experimental'"):
                make(linear, recipe=recipe, profile="hopper")
            with pytest.raises(KeyError):
                make(linear, recipe=recipe, profile="no-such-gpu")
    finally:
        context.__exit__(None, None, None)


def test_weight_scales_are_kept_plain_and_swizzled_per_call():
    context = _quiet()
    try:
        linear = torch.nn.Linear(128, 130)
        layer = mmaemu.nn.EmulatedFP8Linear.from_linear(linear, recipe="mxfp8")
        q = block_quantize.quantize_mx(linear.weight.detach(), "e4m3")
        assert layer.weight_scale.shape == (130, 4) and torch.equal(layer.weight_scale.view(torch.uint8),
                                                                    q.scales.view(torch.uint8))
        assert scale_layout.to_blocked(layer.weight_scale).numel() == scale_layout.blocked_shape(130, 4).numel
    finally:
        context.__exit__(None, None, None)


def test_compiled_block_scaled_layers_give_the_eager_bits():
    """The layers are a graph break (their casts run eagerly), so a compiled model gets the eager bits."""
    model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.GELU())
    context = _quiet()
    try:
        mmaemu.nn.convert_linears(model, recipe="mxfp8")
        x = torch.randn(6, 128) * 3
        with torch.no_grad():
            eager = model(x)
            compiled = torch.compile(model, backend="eager")(x)
    finally:
        context.__exit__(None, None, None)
    assert torch.equal(eager.view(torch.int32), compiled.view(torch.int32))


def test_mxfp4_weight_is_torchaos_mx_cast():
    """The layer keeps torchao 0.18.0's MXFP4 weight: MXTensor.to_mx codes and E8M0 scales (tests/test_block_quantize.py
    compares the cast itself on adversarial rows)."""
    from test_block_quantize import _torchao

    _, mx_tensor, _ = _torchao()
    linear = torch.nn.Linear(96, 48)
    scales, data = mx_tensor.to_mx(linear.weight.detach().clone(), torch.float4_e2m1fn_x2, 32)
    context = _quiet()
    try:
        layer = mmaemu.nn.EmulatedFP8Linear.from_linear(linear, recipe="mxfp4")
    finally:
        context.__exit__(None, None, None)
    assert torch.equal(layer.weight.view(torch.uint8), data.view(torch.uint8))
    assert torch.equal(layer.weight_scale.view(torch.uint8), scales.view(torch.uint8).reshape(48, 3))


def test_nvfp4_layer_takes_every_in_features_torch_takes():
    """in_features = 96 and 160 (torchao's NVFP4 test shapes, K % 64 == 32): the layer computes (the last
    kind::mxf4nvf4 instruction zero-padded) and equals its own dispatch; 48 is refused (torch needs K / 2 % 16)."""
    context = _quiet()
    try:
        for K in (96, 160):
            torch.manual_seed(K)
            linear = torch.nn.Linear(K, 16)
            x = torch.randn(3, K)
            qw = block_quantize.quantize_nvfp4(linear.weight.detach(), swizzle=True)
            qx = block_quantize.quantize_nvfp4(x, swizzle=True)
            gemm = mmaemu.scaled_mm(qx.codes, qw.codes.t(), qx.scales, qw.scales, out_dtype=torch.float32,
                                    profile=PROFILE, splitk=1)
            want = gemm * (torch.tensor(qx.global_scale) * torch.tensor(qw.global_scale)) + linear.bias.detach()
            layer = mmaemu.nn.EmulatedFP8Linear.from_linear(linear, recipe="nvfp4")
            with torch.no_grad():
                assert torch.equal(_bits(layer(x)), _bits(want))
        with pytest.raises(UnsupportedFeatureError, match="multiple of 32"):
            mmaemu.nn.EmulatedFP8Linear.from_linear(torch.nn.Linear(48, 16), recipe="nvfp4")
    finally:
        context.__exit__(None, None, None)


def test_torchaos_mxfp4_operands_give_the_mxfp4_layers_bits():
    """The tensors torchao 0.18.0's _addmm_mx_dispatch hands F.scaled_mm for MXFP4 (a.qdata [M, K/2], b.qdata
    [K/2, N] column-major, a.scale and b.scale.t() swizzled, bf16 output), passed to mmaemu.scaled_mm, give the bits
    of recipe="mxfp4" (torchao's FLOOR scale rule; K = 96, the zero-padded last instruction)."""
    from test_block_quantize import _torchao

    config, mx_tensor, _ = _torchao()
    fp4 = torch.float4_e2m1fn_x2
    torch.manual_seed(8)
    linear = torch.nn.Linear(96, 32, bias=False).to(torch.bfloat16)
    x = torch.randn(6, 96, dtype=torch.bfloat16)
    floor = config.ScaleCalculationMode.FLOOR
    a = mx_tensor.MXTensor.to_mx(x, fp4, 32, scaling_mode=floor, is_swizzled_scales=True)
    b = mx_tensor.MXTensor.to_mx(linear.weight.detach(), fp4, 32, scaling_mode=floor, is_swizzled_scales=True).t()
    context = _quiet()
    try:
        got = mmaemu.scaled_mm(a.qdata.view(fp4), b.qdata.view(fp4), a.scale, b.scale.t(), out_dtype=torch.bfloat16,
                               profile=PROFILE)
        layer = mmaemu.nn.EmulatedFP8Linear.from_linear(linear, recipe="mxfp4")
        with torch.no_grad():
            want = layer(x)
    finally:
        context.__exit__(None, None, None)
    assert torch.equal(_bits(got), _bits(want))

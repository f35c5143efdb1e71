"""``recipe="rowwise"`` inside a model: torchao's row-wise casts and mmaemu's row-wise ``scaled_mm``, layer by layer."""

from __future__ import annotations

import warnings

import pytest
import torch

import mmaemu
from mmaemu.errors import ExperimentalPresetWarning, UnsupportedFeatureError
from mmaemu.quantize import quantize_rowwise


def _model(dtype):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(256, 96), torch.nn.ReLU(), torch.nn.Linear(96, 48, bias=False))
    return model.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_convert_linears_rowwise_equals_the_casts_and_scaled_mm(dtype):
    model = _model(dtype)
    x = torch.randn(7, 256, dtype=dtype) * 3
    first = model[0]
    w_fp8, sw = quantize_rowwise(first.weight.detach())
    x_fp8, sx = quantize_rowwise(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalPresetWarning)
        want = mmaemu.scaled_mm(x_fp8, w_fp8.t(), sx.reciprocal(), sw.reciprocal().reshape(1, -1),
                                bias=first.bias.detach().to(torch.bfloat16), out_dtype=torch.bfloat16,
                                use_fast_accum=True)
        mmaemu.nn.convert_linears(model, recipe="rowwise")
        assert type(model[0]).__name__ == "RowwiseFP8Linear" and model[0].recipe == "rowwise"
        with torch.no_grad():
            got = model[0](x)
            assert got.dtype == dtype  # the input's dtype: the bf16 result, widened exactly
            assert torch.equal(got.to(torch.bfloat16).view(torch.int16), want.view(torch.int16))
            assert model(x).shape == (7, 48)
            assert model[0].explain(x).kernel == "cutlass rowwise"


def test_a_row_does_not_depend_on_its_batch():
    model = _model(torch.float32)
    mmaemu.nn.convert_linears(model, recipe="rowwise")
    x = torch.randn(9, 256) * 2
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ExperimentalPresetWarning)
        assert torch.equal(model(x)[4:5], model(x[4:5]))


def test_rowwise_refuses_what_the_recipe_does_not_take():
    linear = torch.nn.Linear(128, 16)
    make = mmaemu.nn.EmulatedFP8Linear.from_linear
    with pytest.raises(UnsupportedFeatureError, match="no input_scale"):
        make(linear, recipe="rowwise", input_scale=torch.tensor(1.0))
    with pytest.raises(UnsupportedFeatureError, match="no split-K"):
        make(linear, recipe="rowwise", splitk=(2, "contiguous"))
    with pytest.raises(UnsupportedFeatureError, match="writes bfloat16"):
        make(linear, recipe="rowwise", out_dtype=torch.float16)
    layer = make(linear, recipe="rowwise", profile="ada")
    with pytest.raises(UnsupportedFeatureError), torch.no_grad():  # Ada's row-wise kernel is not modelled
        layer(torch.randn(2, 128))
    with pytest.raises(UnsupportedFeatureError, match="inference-only"):
        make(linear, recipe="rowwise")(torch.randn(2, 128, requires_grad=True))


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_compiled_recipe_layers_give_the_eager_bits(recipe):
    """The recipe layers are a graph break (their casts run eagerly), so a compiled model gets the eager bits."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.GELU())
    mmaemu.nn.convert_linears(model, recipe=recipe)
    x = torch.randn(6, 256) * 3
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        eager = model(x)
        compiled = torch.compile(model, backend="eager")(x)
    assert torch.equal(eager.view(torch.int32), compiled.view(torch.int32))

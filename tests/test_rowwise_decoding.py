"""The row-wise layer's decoding step (:meth:`mmaemu.nn_recipes.RowwiseFP8Linear.forward` on a CPU input of one
cast task): the compiled row-wise cast (:func:`mmaemu.quantize.rowwise_cast_codes`) against torch's operations, and
the layer's bits against the reference engine's ``scaled_mm`` of torch's casts, with either CPU engine forced."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import mmaemu
from mmaemu import nn_recipes
from mmaemu.base.gpu_torch_ops import power_of_two_floor
from mmaemu.errors import ExperimentalPresetWarning
from mmaemu.nn_recipes import RowwiseFP8Linear
from mmaemu.quantize import FP8_MAX, TORCHAO_EPS, quantize_rowwise, rowwise_cast_codes


def _torch_cast(x):
    """torchao's row-wise cast by torch's operations (rowwise_scale's torch branch, then the fp32 product, the
    clamp and torch's cast): (codes uint8, scale float32 [rows, 1])."""
    magnitude = torch.abs(x).to(torch.float32)
    amax = torch.amax(magnitude, dim=-1, keepdim=True).to(torch.float64)
    scale = (FP8_MAX["e4m3"] / torch.clamp(amax, min=TORCHAO_EPS)).to(torch.float32)
    scale = torch.from_numpy(power_of_two_floor(scale.numpy(), rule="test", way_out="none"))
    q = (x.to(torch.float32) * scale).clamp(min=-448.0, max=448.0).to(torch.float8_e4m3fn)
    return q.view(torch.uint8).numpy(), scale


def _activations(rng, M, K):
    """Rows of every kind: random normal of a random binade, zeros of both signs, subnormal, huge, mixed."""
    x = (rng.standard_normal((M, K)) * 2.0 ** rng.integers(-30, 30, (M, 1))).astype(np.float32)
    kind = rng.integers(0, 5)
    if kind == 1:
        x[0] = 0.0
        x[0, ::3] = -0.0
    elif kind == 2:
        x[0] = (rng.standard_normal(K) * 1e-41).astype(np.float32)
    elif kind == 3:
        x[0, : K // 2] = np.float32(3.0e38)
        x[0, 1] = np.float32(-3.3e38)
    elif kind == 4:
        x[0, ::7] = np.float32(1e-30)
        x[0, 1] = np.float32(6e4)
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_compiled_rowwise_cast_is_torchs(dtype):
    """rowwise_cast_codes = torch's operations (codes, and the reciprocal of the scale), on adversarial rows; None
    where a row holds a NaN or an Inf."""
    rng = np.random.default_rng(7)
    for trial in range(60):
        M, K = int(rng.integers(1, 4)), int(rng.integers(1, 700))
        x = torch.from_numpy(_activations(rng, M, K)).to(dtype)
        if not torch.isfinite(x).all():
            assert rowwise_cast_codes(x) is None
            continue
        got = rowwise_cast_codes(x)
        want_codes, scale = _torch_cast(x)
        assert got is not None
        codes, inverses = got
        assert np.array_equal(codes, want_codes), trial
        assert np.array_equal(inverses.view(np.uint32), scale.reciprocal().reshape(-1).numpy().view(np.uint32))
    for bad in (np.inf, -np.inf, np.nan):
        x = torch.from_numpy(_activations(rng, 2, 64)).to(dtype)
        x[1, 3] = bad
        assert rowwise_cast_codes(x) is None


def test_compiled_rowwise_cast_declines_near_the_refused_window():
    """An fp32 row whose scale's fraction lies at or above the shortcut's threshold: None (quantize_rowwise's
    power_of_two_floor decides), below it: the cast."""
    from mmaemu.cpu.cast import BELOW_REFUSED_FRACTION

    for fraction in (BELOW_REFUSED_FRACTION - 1, BELOW_REFUSED_FRACTION, 0x7FFFFF):
        scale = np.array([(127 << 23) | fraction], np.uint32).view(np.float32)[0]
        amax = np.float32(448.0 / np.float64(scale))
        x = torch.tensor([[amax, 1.0, -2.0]], dtype=torch.float32)
        amax64 = max(np.float64(amax), TORCHAO_EPS)
        real = np.float32((1.0 / amax64) * 448.0).view(np.uint32) & 0x7FFFFF
        got = rowwise_cast_codes(x)
        assert (got is None) == (real >= BELOW_REFUSED_FRACTION)


def _layer(rng, N, K, nan_row=True):
    """A RowwiseFP8Linear of random codes (one NaN code in a row), weight scales of extreme and non-power-of-two
    values, a bias of extreme bf16 values."""
    codes = rng.integers(0, 256, (N, K)).astype(np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x11
    if nan_row:
        codes[N - 2, K // 3] = 0xFF
    scale = (2.0 ** rng.integers(-20, 20, (N, 1))).astype(np.float32)
    scale[:4, 0] = (3.0, 0.7, 2.0**-60, 2.0**60)
    bias = torch.from_numpy(rng.standard_normal(N).astype(np.float32)).to(torch.bfloat16)
    bias[:3] = torch.tensor([3.0e38, -1e-38, -0.0])
    return RowwiseFP8Linear(torch.from_numpy(codes).view(torch.float8_e4m3fn), torch.from_numpy(scale),
                            bias=bias, profile="hopper", splitk="assume-unsplit")


def _reference(layer, x):
    """torch's casts (quantize_rowwise) and the reference engine's row-wise scaled_mm, in the input's dtype."""
    x_fp8, sx = quantize_rowwise(x.reshape(-1, layer.in_features))
    y = mmaemu.scaled_mm(x_fp8, layer.weight.t(), sx.reciprocal(), layer.weight_scale.reciprocal().reshape(1, -1),
                         bias=layer.bias, out_dtype=torch.bfloat16, use_fast_accum=layer.use_fast_accum,
                         profile=layer.profile, backend="reference")
    return y.to(x.dtype).reshape(tuple(x.shape[:-1]) + (layer.out_features,))


def _same(x, y):
    as_int = {2: torch.int16, 4: torch.int32}
    return x.dtype == y.dtype and torch.equal(x.view(as_int[x.element_size()]), y.view(as_int[y.element_size()]))


@pytest.mark.parametrize("M", [1, 2, 3])
@pytest.mark.parametrize("N,K", [(576, 576), (144, 320), (1536, 576), (64, 64)])
def test_layer_decoding_step_gives_the_reference_bits(M, N, K, monkeypatch):
    """The layer's decoding step (fp32, bf16 and fp16 inputs, NaN and Inf rows taking torch's cast, zero,
    subnormal and huge rows), twice (the weight prepared, then kept), and with each CPU engine forced: the
    reference engine's bits; the compiled call ran for every finite input."""
    rng = np.random.default_rng([M, N, K])
    layer = _layer(rng, N, K)
    steps = nn_recipes._rowwise_steps()
    runs = []
    original = steps.kept_call
    monkeypatch.setattr(steps, "kept_call", lambda *args: runs.append(1) or original(*args))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ExperimentalPresetWarning)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for special in (None, np.nan, np.inf):
                x = torch.from_numpy(_activations(rng, M, K)).to(dtype)
                if special is not None:
                    x[M - 1, K // 2] = special
                want = _reference(layer, x)
                count = len(runs)
                for _ in range(2):
                    assert _same(layer(x), want), (dtype, special)
                finite = bool(torch.isfinite(x).all())
                assert (len(runs) > count) == finite
                for engine in ("tile", "offset"):
                    monkeypatch.setenv("MMAEMU_CPU_ENGINE", engine)
                    assert _same(layer(x), want), (engine, dtype, special)
                    monkeypatch.delenv("MMAEMU_CPU_ENGINE")
        x = torch.randn(2, 3, K)  # leading dimensions
        assert _same(layer(x), _reference(layer, x))


def test_a_weight_changed_behind_the_version_counter():
    """The weight's codes, its scales and the bias written through numpy (no version bump): the next decoding step
    computes with the new ones."""
    rng = np.random.default_rng(11)
    layer = _layer(rng, 256, 384, nan_row=False)
    x = torch.from_numpy(_activations(rng, 1, 384))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ExperimentalPresetWarning)
        layer(x), layer(x)
        layer.weight.view(torch.uint8).numpy()[5, 7] ^= 0x11
        layer.weight_scale.numpy()[1, 0] = 2.0**-20
        layer.bias.view(torch.int16).numpy()[3] = 0x4000
        assert _same(layer(x), _reference(layer, x))

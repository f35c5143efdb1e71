"""The block-wise layer's kept prefill call (mmaemu.deepgemm.gemm_nt_kept_prefill: DeepGEMM's per-token cast
compiled, the plan kept per shape, the front door's chunked kernel on the layer's kept panels): bit for bit the
layer's output through DeepGEMM's front door on the reference engine, with either CPU engine forced, and the
oracle's integers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_blockwise_rows import _adversarial_activations, _assert_layer_matches_oracle, _front_door, _layer, \
    _same_tensor

from mmaemu import deepgemm
from mmaemu.cpu.fused import ROW_KERNEL_ROWS
from mmaemu.nn_recipes import BlockwiseFP8Linear

pytestmark = [pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning")]


def _counting(monkeypatch):
    """A list that gets one entry per prefill call that returned the output (not the front door's None)."""
    runs = []
    original = deepgemm.gemm_nt_kept_prefill

    def counted(*args, **kwargs):
        y = original(*args, **kwargs)
        if y is not None:
            runs.append(1)
        return y

    monkeypatch.setattr(deepgemm, "gemm_nt_kept_prefill", counted)
    return runs


@pytest.mark.parametrize("M", [ROW_KERNEL_ROWS + 1, 16, 64])
@pytest.mark.parametrize("N,K", [(576, 576), (130, 300), (192, 129), (1536, 576)])
def test_layer_prefill_gives_the_front_doors_bits(M, N, K, monkeypatch):
    """A BlockwiseFP8Linear's prefill (kept weight) with NaN/Inf activations, values under the amax floor, extreme
    exponents, a NaN code in a weight row, a zero block scale, fp32 and bf16 inputs, K not a multiple of 128: the
    bits of the reference engine's front door, under auto and with MMAEMU_CPU_ENGINE=tile and offset (each the
    prefill call on that engine's kept panels), and the prefill call did run (after the first, preparing call)."""
    rng = np.random.default_rng([M, N, K])
    layer = _layer(rng, N, K, nan_row=N - 1, zero_block=True)
    runs = _counting(monkeypatch)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.from_numpy(_adversarial_activations(rng, M, K)).to(dtype)
        with torch.no_grad():
            want = _front_door(layer, x, "reference")
            for engine in (None, "tile", "offset"):
                if engine is not None:
                    monkeypatch.setenv("MMAEMU_CPU_ENGINE", engine)
                for _ in range(2):  # the first call of an engine prepares its panels, the second reads them kept
                    count = len(runs)
                    got = layer(x)
                    assert got.dtype == dtype and _same_tensor(got, want), engine
                    assert len(runs) == count + 1
                monkeypatch.delenv("MMAEMU_CPU_ENGINE", raising=False)


@pytest.mark.parametrize("scale", [0.0, 2.0**-140, 2.0**-126, np.float32(3.0e38), -1.0, np.inf, np.nan])
def test_extreme_block_scales(scale, monkeypatch):
    """Zero, subnormal, the smallest normal, huge, negative, Inf and NaN block scales of the weight, 3-D input:
    the front door's bits."""
    rng = np.random.default_rng(7)
    layer = _layer(rng, 256, 384)
    layer.weight_scale[1, 1] = float(scale)
    layer.weight_scale[0, 2] = float(scale)
    runs = _counting(monkeypatch)
    x = torch.from_numpy(_adversarial_activations(rng, 24, 384)).reshape(2, 12, 384)
    with torch.no_grad():
        want = _front_door(layer, x, "reference")
        for _ in range(2):
            assert _same_tensor(layer(x), want)
    assert runs


def test_a_weight_changed_behind_the_version_counter(monkeypatch):
    """The weight's codes written through numpy (no version bump) and its scales changed: the next prefill call
    computes with the new ones."""
    rng = np.random.default_rng(11)
    layer = _layer(rng, 256, 384)
    runs = _counting(monkeypatch)
    x = torch.from_numpy(_adversarial_activations(rng, 16, 384))
    with torch.no_grad():
        layer(x), layer(x)
        layer.weight.view(torch.uint8).numpy()[5, 7] ^= 0x11
        layer.weight_scale.numpy()[1, 2] = 2.0**-20
        assert _same_tensor(layer(x), _front_door(layer, x, "reference"))
    assert len(runs) == 3


def test_the_prefill_plan(monkeypatch):
    """The prefill call runs on the CPU engine only: the reference backend, a decoding step's rows, no kept
    weight's slot and an unknown backend go to the front door (which raises the unknown backend's error)."""
    rng = np.random.default_rng(3)
    layer = _layer(rng, 192, 256)
    x = torch.from_numpy(rng.standard_normal((8, 256)).astype(np.float32))
    slot = object()
    assert deepgemm.gemm_nt_kept_prefill(x, layer.weight, layer.weight_scale, backend="reference",
                                         weights=slot) is None
    assert deepgemm.gemm_nt_kept_prefill(x[:ROW_KERNEL_ROWS], layer.weight, layer.weight_scale,
                                         weights=slot) is None
    assert deepgemm.gemm_nt_kept_prefill(x, layer.weight, layer.weight_scale, weights=None) is None
    assert deepgemm.gemm_nt_kept_prefill(x, layer.weight, layer.weight_scale, backend="no-such-backend",
                                         weights=slot) is None
    reference = BlockwiseFP8Linear(layer.weight, layer.weight_scale, bias=layer.bias, backend="reference")
    runs = _counting(monkeypatch)
    with torch.no_grad():
        assert _same_tensor(reference(x), _front_door(layer, x, "reference"))
    assert not runs


def test_oracle_of_one_prefill_call():
    """One prefill call of the layer (M = 5, N = 70, K = 300) against the oracle's integers (DeepGEMM's bf16
    output)."""
    rng = np.random.default_rng(5)
    layer = _layer(rng, 70, 300, bias=False)
    _assert_layer_matches_oracle(layer, torch.from_numpy(rng.standard_normal((5, 300)).astype(np.float32)))

"""On a real CUDA GPU (marker ``cuda``; skipped where torch sees none): CUDA tensors in, CUDA tensors out, with the
bits of the CPU engine, whichever kernel the dispatcher picks on the device."""

import warnings

import numpy as np
import pytest
import torch

import mmaemu
from mmaemu import formats
from mmaemu.testing import assert_bitwise_equal

pytestmark = pytest.mark.cuda


def _operands(fmt_a, fmt_b, M=40, N=48, K=320):
    rng = np.random.default_rng(17)
    a = torch.from_numpy(formats.random_codes(rng, (M, K), fmt_a, spread=1.5, centre=2)).view(formats.DTYPE_OF[fmt_a])
    w = torch.from_numpy(formats.random_codes(rng, (N, K), fmt_b, spread=1.5, centre=2)).view(formats.DTYPE_OF[fmt_b])
    return a, w


@pytest.mark.parametrize("profile", ["hopper", "ada"])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("fmts", [("e4m3", "e4m3"), ("e4m3", "e5m2")])
def test_scaled_mm_on_the_gpu_returns_the_cpu_bits(profile, fast, fmts):
    a, w = _operands(*fmts)
    scale_a, scale_b = torch.tensor(0.5), torch.tensor(0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.BackendFallbackWarning)  # a kernel failing here is the gate's business
        want = mmaemu.scaled_mm(a, w.t(), scale_a, scale_b, out_dtype=torch.bfloat16, use_fast_accum=fast,
                                profile=profile, splitk=1, backend="cpu")
        got = mmaemu.scaled_mm(a.cuda(), w.cuda().t(), scale_a.cuda(), scale_b.cuda(), out_dtype=torch.bfloat16,
                               use_fast_accum=fast, profile=profile, splitk=1)
    assert got.device.type == "cuda"
    assert_bitwise_equal(got.cpu(), want)


@pytest.mark.parametrize("splitk", [(2, "contiguous"), (3, "contiguous")])
def test_split_accumulate_on_the_gpu_returns_the_cpu_bits(splitk):
    a, w = _operands("e5m2", "e4m3", K=1024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.BackendFallbackWarning)
        want = mmaemu.accumulate(a, w, use_fast_accum=False, profile="hopper", splitk=splitk, backend="cpu")
        got = mmaemu.accumulate(a.cuda(), w.cuda(), use_fast_accum=False, profile="hopper", splitk=splitk)
    assert got.device.type == "cuda"
    assert_bitwise_equal(got.cpu(), want)

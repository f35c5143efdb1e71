"""The format vocabulary of mmaemu.formats: one reading of a format from a dtype, one generator of random codes."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from mmaemu import formats, quantize
from mmaemu.platform import get_profile
from mmaemu.platform.splitk import resolve_splitk


@pytest.mark.parametrize("spelling, fmt", [
    (torch.float8_e4m3fn, "e4m3"), (torch.float8_e5m2, "e5m2"), ("float8_e4m3fn", "e4m3"),
    ("torch.float8_e5m2", "e5m2"), ("e4m3", "e4m3"), ("e5m2", "e5m2"),
])
def test_fmt_of_reads_every_spelling(spelling, fmt):
    assert formats.fmt_of(spelling) == fmt
    assert formats.TORCH_NAMES[fmt] == str(formats.DTYPE_OF[fmt]).replace("torch.", "")


@pytest.mark.parametrize("bad, text", [
    (torch.float8_e4m3fnuz, "float8_e4m3fnuz is not supported: the reference GPUs use float8_e4m3fn"),
    ("float8_e5m2fnuz", "float8_e5m2fnuz is not supported"),
    (torch.float16, "expected torch.float8_e4m3fn, torch.float8_e5m2, 'e4m3' or 'e5m2', got torch.float16"),
    (3, "got 3"), ("E4M3", "got 'E4M3'"),
])
def test_fmt_of_refuses_with_one_error_that_is_both_classes_callers_raised(bad, text):
    with pytest.raises(formats.FormatNameError, match=text) as info:
        formats.fmt_of(bad)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


def test_every_caller_reads_formats_through_fmt_of():
    profile = get_profile("hopper")
    with pytest.raises(TypeError, match="float8_e4m3fnuz is not supported"):
        profile.rejection("float8_e4m3fnuz", "e4m3", "float32")
    with pytest.raises(TypeError, match="got torch.float16"):
        resolve_splitk(16, 16, 16, a_dtype="e4m3", b_dtype=torch.float16, out_dtype="float32",
                       use_fast_accum=True, profile="hopper", splitk=1)
    assert resolve_splitk(16, 16, 16, a_dtype=torch.float8_e5m2, b_dtype="e4m3", out_dtype=None,
                          use_fast_accum=True, profile="hopper", splitk=1).S == 1
    with pytest.raises(ValueError, match="fmt must be 'e4m3' or 'e5m2'"):
        quantize.quantize(torch.ones(2), 1.0, "float16")


def test_is_fp8_dtype_names_the_modelled_dtypes_only():
    assert formats.is_fp8_dtype(torch.float8_e4m3fn) and formats.is_fp8_dtype("float8_e5m2")
    assert not formats.is_fp8_dtype("e4m3") and not formats.is_fp8_dtype(torch.float8_e4m3fnuz)
    assert not formats.is_fp8_dtype(torch.float16) and not formats.is_fp8_dtype(None)


@pytest.mark.subprocess
def test_importing_formats_does_not_import_torch():
    code = "import sys, mmaemu.formats, mmaemu.cli.operands; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_encode_gives_finite_codes_only(fmt):
    sign, field, mant = np.meshgrid(np.arange(2), np.arange(-1, 34), np.arange(9), indexing="ij")
    codes = formats.encode(fmt, sign, field, mant)
    assert not formats.nonfinite_mask(codes, fmt).any()
    top = formats.TOP_FIELD[fmt]
    largest = formats.encode(fmt, 0, top, (1 << formats.MANT_BITS[fmt]) - 1)
    assert formats.decode(largest, fmt) == formats.FP8_MAX[fmt]
    assert formats.decode(formats.encode(fmt, 1, 0, 1), fmt) == -(2.0 ** (formats.EMIN[fmt] - formats.MANT_BITS[fmt]))


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_random_codes_follow_their_field_rule(fmt):
    rng = np.random.default_rng(5)
    bias = {"e4m3": 7, "e5m2": 15}[fmt]
    mbits = formats.MANT_BITS[fmt]
    uniform = formats.random_codes(rng, (64, 64), fmt)
    fields = (uniform & 0x7F) >> mbits
    assert fields.min() == 1 and fields.max() == formats.TOP_FIELD[fmt]
    assert not formats.nonfinite_mask(uniform, fmt).any() and (uniform & 0x80).any()
    narrow = formats.random_codes(rng, 1000, fmt, fields=(0, 2))
    assert set(((narrow & 0x7F) >> mbits).tolist()) == {0, 1, 2}
    spread = formats.random_codes(rng, 4000, fmt, spread=1.5, centre=4)
    field_mean = ((spread & 0x7F) >> mbits).mean()
    assert abs(field_mean - (bias + 4)) < 0.2
    again = formats.random_codes(np.random.default_rng(5), (64, 64), fmt)
    assert np.array_equal(again, uniform)

"""The block-scaled formats and presets (semantics.md b.5): tables, the FP4 packing, the model's rules, and the
instructions against a Fraction oracle written from the design note (independent of mmaemu and of MMA-Sim; the
external oracle is tests/test_mmasim_block_scale.py).
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch

import mmaemu
from mmaemu import formats
from test_mmasim_block_scale import MXF4, MXF8, _ours, element_values, make_cases, scale_values

EXPONENT_BITS = {"e3m2": 3, "e2m3": 2, "e2m1": 2}


# ---------------------------------------------------------------------------------------------------------------
# Formats


@pytest.mark.parametrize("fmt", formats.OPERAND_FORMATS)
def test_element_tables_equal_the_bit_field_decoding(fmt):
    expected = element_values(fmt)
    ours = formats.values(fmt)
    assert len(ours) == len(expected) == 1 << formats.CODE_BITS[fmt]
    assert np.array_equal(ours, expected, equal_nan=True)
    assert np.array_equal(np.signbit(ours), np.signbit(expected))
    finite = np.isfinite(expected) & (expected != 0)
    sig, exp = formats.significands(fmt), formats.exponents(fmt)
    assert np.array_equal(sig[finite] * 2.0 ** (exp[finite] - formats.MANT_BITS[fmt]), expected[finite])
    assert formats.MAX_FINITE[fmt] == np.nanmax(np.abs(np.where(np.isinf(expected), np.nan, expected)))


def test_fp6_fp4_have_no_special_codes_and_refuse_wide_codes():
    for fmt in ("e3m2", "e2m3", "e2m1"):
        assert not formats.nonfinite_codes(fmt).any()
        with pytest.raises(ValueError, match="unpack_fp4|bit"):
            formats.decode(np.array([1 << formats.CODE_BITS[fmt]], np.uint8), fmt)


def test_scale_tables():
    codes = np.arange(256, dtype=np.uint8)
    e8m0 = torch.from_numpy(codes).view(torch.float8_e8m0fnu).double().numpy()
    assert np.array_equal(formats.decode_scales(codes, "ue8m0"), e8m0, equal_nan=True)
    assert np.array_equal(formats.decode_scales(codes, "ue8m0"), scale_values("ue8m0"), equal_nan=True)
    ue4m3 = formats.decode_scales(codes, "ue4m3")
    assert np.array_equal(ue4m3, scale_values("ue4m3"), equal_nan=True)
    assert np.array_equal(ue4m3[:128], ue4m3[128:], equal_nan=True)  # the sign bit is ignored
    for fmt in formats.SCALE_FORMATS:
        value, sig, exp = (formats.decode_scales(codes, fmt), formats.scale_significands(fmt),
                           formats.scale_exponents(fmt))
        ok = np.isfinite(value) & (value > 0)
        assert np.array_equal(sig[ok] * 2.0 ** (exp[ok] - formats.SCALE_MANT_BITS[fmt]), value[ok])
        assert np.array_equal(formats.scale_nan_codes(fmt), np.isnan(value))


def test_fp4_packing_is_low_nibble_first():
    """torch's float4_e2m1fn_x2: the first element of a pair is the low nibble of its byte."""
    assert formats.unpack_fp4(np.array([[0x21, 0xF0]], np.uint8)).tolist() == [[1, 2, 0, 15]]
    codes = np.random.default_rng(0).integers(0, 16, (5, 64)).astype(np.uint8)
    assert np.array_equal(formats.unpack_fp4(formats.pack_fp4(codes)), codes)
    with pytest.raises(ValueError):
        formats.pack_fp4(np.array([1, 2, 3], np.uint8))


# ---------------------------------------------------------------------------------------------------------------
# The model's rules


def _fp8(shape, seed=0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 4).to(torch.float8_e4m3fn)


def _ue8m0(shape, code=127):
    return torch.full(shape, code, dtype=torch.uint8).view(torch.float8_e8m0fnu)


def test_unit_scales_reduce_mxf8f6f4_to_the_unscaled_instruction():
    a, b = _fp8((200, 64)), _fp8((200, 64), 1)
    c = torch.randn(200) * 50
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        scaled = mmaemu.model.dot(a, b, c, preset="tcgen05_mxf8f6f4", scale_a=_ue8m0((200, 2)),
                                  scale_b=_ue8m0((200, 2)))
        plain = mmaemu.model.dot(a, b, c, preset="tcgen05_f8f6f4")
    assert torch.equal(scaled.view(torch.int32), plain.view(torch.int32))


def test_scaling_is_not_dequantisation_when_c_is_nonzero():
    """A scale 2**-8 on a against c: scaling before the alignment keeps a's products exact where dequantising the
    operands first (impossible here anyway: 2**-8 x E4M3 is not an E4M3 value) could not; the results differ from
    the unscaled instruction applied to the same products by exactly the expected power of two only when c = 0."""
    a, b = _fp8((500, 32)), _fp8((500, 32), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        zero_c = mmaemu.model.dot(a, b, preset="tcgen05_mxf8f6f4", scale_a=_ue8m0((500, 1), 119),
                                  scale_b=_ue8m0((500, 1)))
        plain = mmaemu.model.dot(a, b, preset="tcgen05_f8f6f4")
    assert torch.equal(zero_c, plain * 2.0 ** -8)


def test_dot_refuses_what_the_instructions_do_not_take():
    a, b = _fp8((4, 32)), _fp8((4, 32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        with pytest.raises(TypeError, match="scale_a= and scale_b= are required"):
            mmaemu.model.dot(a, b, preset="tcgen05_mxf8f6f4")
        with pytest.raises(TypeError, match="takes no scales"):
            mmaemu.model.dot(a, b, preset="tcgen05_f8f6f4", scale_a=_ue8m0((4, 1)), scale_b=_ue8m0((4, 1)))
        with pytest.raises(ValueError, match="one ue8m0 per 32"):
            mmaemu.model.dot(a, b, preset="tcgen05_mxf8f6f4", scale_a=_ue8m0((4, 2)), scale_b=_ue8m0((4, 2)))
        with pytest.raises(ValueError, match="takes operands in"):
            mmaemu.model.dot(torch.zeros(4, 64, dtype=torch.uint8), torch.zeros(4, 64, dtype=torch.uint8),
                             preset="tcgen05_mxf4nvf4", fmt="e2m3", scale_a=_ue8m0((4, 2)), scale_b=_ue8m0((4, 2)))
        with pytest.raises(ValueError, match="whole number"):
            mmaemu.model.dot(torch.zeros(4, 48, dtype=torch.uint8), torch.zeros(4, 48, dtype=torch.uint8),
                             preset="tcgen05_mxf4nvf4", fmt="e2m1", scale_a=_ue8m0((4, 3)), scale_b=_ue8m0((4, 3)))
        with pytest.raises(TypeError, match="fmt= must name"):
            mmaemu.model.dot(torch.zeros(4, 32, dtype=torch.uint8), torch.zeros(4, 32, dtype=torch.uint8),
                             preset="tcgen05_mxf8f6f4", scale_a=_ue8m0((4, 1)), scale_b=_ue8m0((4, 1)))


def test_block_scaled_presets_have_no_unscaled_gemm_schedule():
    """Their GEMMs are block-scaled scaled_mm calls (tests/test_block_scaled_scaled_mm.py); a tensor-wise call or
    the unscaled schedule is refused."""
    profile = mmaemu.profile_from_preset("tcgen05_mxf8f6f4", base="hopper")
    x = torch.zeros(16, 32, dtype=torch.float8_e4m3fn)
    with pytest.raises(mmaemu.UnsupportedFeatureError, match="block-scaled"):
        mmaemu.accumulate(x, x, use_fast_accum=True, profile=profile, splitk=1)
    preset = mmaemu.get_preset("sm120_mxf4nvf4", warn=False)
    from mmaemu.arith.params import schedule_params

    with pytest.raises(mmaemu.UnsupportedFeatureError, match="block-scaled"):
        schedule_params(preset, 64, True)


# ---------------------------------------------------------------------------------------------------------------
# A Fraction oracle of the design note's rules (scaling-recipes.md section 4), sharing no code with mmaemu


def _exponent(value: Fraction, emin: int) -> int:
    """floor(log2 |value|), at least emin (a subnormal aligns at its format's minimum exponent)."""
    e = math.floor(math.log2(abs(value)))
    while Fraction(2) ** e > abs(value):
        e -= 1
    while Fraction(2) ** (e + 1) <= abs(value):
        e += 1
    return max(e, emin)


def _to_fp32_toward_zero(x: Fraction) -> int:
    """fp32 bits of x rounded toward zero (24 significant bits, subnormals on 2**-149); 2**128 and beyond: Inf; a
    zero result is +0."""
    if x == 0:
        return 0
    sign = 0x80000000 if x < 0 else 0
    mag = abs(x)
    e = max(_exponent(mag, -126), -126)
    if e >= 128:
        return sign | 0x7F800000
    units = math.floor(mag / Fraction(2) ** (e - 23))
    if units == 0:
        return 0
    value = float(units * Fraction(2) ** (e - 23))
    return sign | int(np.float32(value).view(np.uint32))


def _trunc_to(x: Fraction, grid: Fraction) -> Fraction:
    q = abs(x) // grid
    return q * grid if x >= 0 else -q * grid


def _emin(fmt):
    return {"e4m3": -6, "e5m2": -14, "e3m2": -2, "e2m3": 0, "e2m1": 0}[fmt]


def _scale_exponent(value: Fraction, fmt) -> int:
    return _exponent(value, -127 if fmt == "ue8m0" else -6)


def oracle_mxf8(a, b, sa, sb, c_bits, fmt_a, fmt_b):
    """kind::mxf8f6f4: products at exponent ea + eb + e(sa) + e(sb) and c aligned together, each cut toward zero
    onto 2**(E - 25); zero terms take -133; the exact sum rounded toward zero to fp32."""
    va, vb = element_values(fmt_a), element_values(fmt_b)
    scale = Fraction(scale_values("ue8m0")[sa[0]]) * Fraction(scale_values("ue8m0")[sb[0]])
    e_scale = _scale_exponent(Fraction(scale_values("ue8m0")[sa[0]]), "ue8m0") + \
        _scale_exponent(Fraction(scale_values("ue8m0")[sb[0]]), "ue8m0")
    terms = []
    for x, y in zip(a, b):
        fx, fy = Fraction(va[x]), Fraction(vb[y])
        if fx == 0 or fy == 0:
            terms.append((Fraction(0), -133))
        else:
            terms.append((fx * fy * scale, _exponent(fx, _emin(fmt_a)) + _exponent(fy, _emin(fmt_b)) + e_scale))
    c = Fraction(float(np.uint32(c_bits).view(np.float32)))
    terms.append((c, -133 if c == 0 else _exponent(c, -126)))
    E = max(e for _, e in terms)
    grid = Fraction(2) ** (E - 25)
    return _to_fp32_toward_zero(sum(_trunc_to(v, grid) for v, _ in terms))


def oracle_mxf4(a, b, sa, sb, c_bits, block, scale_fmt):
    """kind::mxf4nvf4: groups of 16 products summed exactly, times the product of their scales, at the exponent of
    that product (-139 for a group of zero products or a zero scale); c beside them; each term cut toward zero onto
    2**(E - 35); the exact sum rounded toward zero to fp32."""
    v = element_values("e2m1")
    scales = scale_values(scale_fmt)
    terms = []
    for g in range(0, len(a), 16):
        products = [Fraction(v[x]) * Fraction(v[y]) for x, y in zip(a[g:g + 16], b[g:g + 16])]
        s_a, s_b = Fraction(scales[sa[g // block]]), Fraction(scales[sb[g // block]])
        if all(p == 0 for p in products) or s_a * s_b == 0:
            terms.append((Fraction(0), -139))
        else:
            terms.append((sum(products) * s_a * s_b, _scale_exponent(s_a, scale_fmt) + _scale_exponent(s_b, scale_fmt)))
    c = Fraction(float(np.uint32(c_bits).view(np.float32)))
    terms.append((c, -139 if c == 0 else _exponent(c, -126)))
    E = max(e for _, e in terms)
    grid = Fraction(2) ** (E - 35)
    return _to_fp32_toward_zero(sum(_trunc_to(t, grid) for t, _ in terms))


def _finite_rows(cases, fmt_a, fmt_b, scale_fmt):
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(element_values(fmt_a)[cases.a]).all(1) & np.isfinite(element_values(fmt_b)[cases.b]).all(1)
        ok &= ~np.isnan(scale_values(scale_fmt)[cases.sa]).any(1) & ~np.isnan(scale_values(scale_fmt)[cases.sb]).any(1)
        ok &= np.isfinite(cases.c.view(np.float32))
    return np.flatnonzero(ok)


@pytest.mark.parametrize("fmt_a,fmt_b", [("e4m3", "e4m3"), ("e5m2", "e2m1"), ("e3m2", "e2m3")])
def test_mxf8f6f4_equals_the_fraction_oracle(fmt_a, fmt_b):
    cases = make_cases(fmt_a, fmt_b, 32, 32, "ue8m0", 1_500, 41)
    ours = _ours(MXF8[0], fmt_a, fmt_b, cases)
    rows = _finite_rows(cases, fmt_a, fmt_b, "ue8m0")
    assert len(rows) > 1_000
    bad = [(i, int(ours[i]), oracle) for i in rows
           if (oracle := oracle_mxf8(cases.a[i], cases.b[i], cases.sa[i], cases.sb[i], cases.c[i], fmt_a, fmt_b))
           != int(ours[i])]
    assert not bad, f"{len(bad)} of {len(rows)} differ; first (case, mmaemu, oracle): {bad[:3]} ({cases.kinds[bad[0][0]]})"


@pytest.mark.parametrize("inst", [MXF4[0], MXF4[2], MXF4[3]], ids=lambda i: i.label)
def test_mxf4nvf4_equals_the_fraction_oracle(inst):
    cases = make_cases("e2m1", "e2m1", 64, inst.block, inst.scale, 1_500, 43)
    ours = _ours(inst, "e2m1", "e2m1", cases)
    rows = _finite_rows(cases, "e2m1", "e2m1", inst.scale)
    assert len(rows) > 1_000
    bad = [(i, int(ours[i]), oracle) for i in rows
           if (oracle := oracle_mxf4(cases.a[i], cases.b[i], cases.sa[i], cases.sb[i], cases.c[i], inst.block,
                                     inst.scale)) != int(ours[i])]
    assert not bad, f"{len(bad)} of {len(rows)} differ; first (case, mmaemu, oracle): {bad[:3]} ({cases.kinds[bad[0][0]]})"

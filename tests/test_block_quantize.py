"""MX and NVFP4 quantisation (mmaemu.block_quantize) against an independent derivation in exact rationals written
from the OCP MX v1.0 specification and the torchao 0.18.0 rule the module docstring states, and against torchao
itself where it is installed."""

from bisect import bisect_left
from fractions import Fraction
import math
import os

import numpy as np
import pytest
import torch

from mmaemu import block_quantize as bq
from mmaemu import formats, scale_layout
from tests import oracle
from tests.cuda_torch import CudaScalarDivision

# ---------------------------------------------------------------------------------------------------------------
# The independent derivation

LAYOUT = {"e4m3": (4, 3), "e5m2": (5, 2), "e2m3": (2, 3), "e3m2": (3, 2), "e2m1": (2, 1)}
EMAX = {"e4m3": 8, "e5m2": 15, "e2m3": 2, "e3m2": 4, "e2m1": 2}  # floor(log2(largest finite value))
NAN, INF = "nan", "inf"


def element_value(code, fmt):
    """Value of a code from its fields (OCP MX v1.0 / OFP8): Fraction, INF or NAN (sign ignored for specials)."""
    ebits, mbits = LAYOUT[fmt]
    bias = (1 << (ebits - 1)) - 1
    field, mant = (code >> mbits) & ((1 << ebits) - 1), code & ((1 << mbits) - 1)
    if fmt == "e4m3" and field == 15 and mant == 7:
        return NAN
    if fmt == "e5m2" and field == 31:
        return INF if mant == 0 else NAN
    if field == 0:
        return mant * oracle.pow2(1 - bias - mbits)
    return ((1 << mbits) + mant) * oracle.pow2(field - bias - mbits)


def positive_grid(fmt):
    ebits, mbits = LAYOUT[fmt]
    codes = [c for c in range(1 << (ebits + mbits)) if isinstance(element_value(c, fmt), Fraction)]
    return [element_value(c, fmt) for c in codes], codes


GRIDS = {fmt: positive_grid(fmt) for fmt in LAYOUT}


def rne_saturate(v, fmt):
    """Code of v (Fraction, +-INF as float, NAN): nearest grid value, ties to the even code, |v| >= max -> max."""
    ebits, mbits = LAYOUT[fmt]
    sign_bit = 1 << (ebits + mbits)
    if isinstance(v, float) and math.isnan(v):
        return 0x7F if ebits + mbits == 7 else 0
    negative = v < 0 or (isinstance(v, float) and math.copysign(1.0, v) < 0)
    magnitude = abs(v)
    values, codes = GRIDS[fmt]
    if magnitude >= values[-1]:
        code = codes[-1]
    else:
        i = bisect_left(values, magnitude)
        if values[i] == magnitude:
            code = codes[i]
        else:
            below, above = values[i - 1], values[i]
            middle = (below + above) / 2
            if magnitude != middle:
                code = codes[i] if magnitude > middle else codes[i - 1]
            else:
                code = codes[i] if codes[i] % 2 == 0 else codes[i - 1]
    return code | (sign_bit if negative else 0)


def exact(x):
    """Fraction of a finite float, else the float itself (inf/nan)."""
    return Fraction(x) if math.isfinite(x) else x


def mx_scale_exponent(amax, fmt, mode):
    """E of the rule: from the exact amax (Fraction) or INF; fp32-subnormal amaxes and zero take -127."""
    if amax == math.inf:
        return 128
    if amax < oracle.pow2(-126):
        return -127 + (1 if mode == "ceil" and amax > 0 else 0)
    e = oracle.floor_log2(amax)
    significand = amax / oracle.pow2(e)  # in [1, 2)
    if mode == "ceil":
        return e + (significand != 1)
    if mode == "even":
        step = oracle.pow2(-LAYOUT[fmt][1])
        rounded = step * math.floor(significand / step + Fraction(1, 2))
        return e + (rounded == 2)
    return e


def oracle_mx(rows, fmt, mode):
    """(element codes, scale codes) of rows of Python floats (fp32 values), blocks of 32."""
    codes, scales = [], []
    for row in rows:
        row_codes, row_scales = [], []
        for start in range(0, len(row), 32):
            block = row[start:start + 32]
            if any(math.isnan(v) for v in block):
                scale, divisor = 0xFF, math.inf
            else:
                amax = max(abs(exact(v)) for v in block)
                unbiased = min(max(mx_scale_exponent(amax, fmt, mode) - EMAX[fmt], -127), 127)
                scale = unbiased + 127
                divisor = oracle.pow2(max(scale, 1) - 127)
            row_scales.append(scale)
            for v in block:
                if divisor == math.inf:
                    quotient = math.copysign(0.0, v) if math.isfinite(v) else math.nan
                elif math.isfinite(v):
                    quotient = Fraction(v) / divisor
                    if quotient == 0:
                        quotient = math.copysign(0.0, v)
                else:
                    quotient = v
                row_codes.append(rne_saturate(quotient, fmt))
        codes.append(row_codes)
        scales.append(row_scales)
    return np.array(codes, np.uint8), np.array(scales, np.uint8)


def fp32(q):
    """RNE to fp32 of an exact rational: the nearest fp32 value as a Fraction (or inf)."""
    value = oracle.fp32_value(oracle.round_fp32(q))
    return value if isinstance(value, Fraction) else math.inf


def ue4m3(v):
    """(code, value) of the e4m3 cast of clamp(v, 2**-6, 448) (v a positive Fraction)."""
    clamped = min(max(v, oracle.pow2(-6)), Fraction(448))
    code = rne_saturate(clamped, "e4m3")
    return code, element_value(code, "e4m3")


def oracle_nvfp4(rows, global_scale):
    """(element codes, scale codes) of finite rows, blocks of 16; global_scale a positive Fraction or None."""
    codes, scales = [], []
    for row in rows:
        row_codes, row_scales = [], []
        for start in range(0, len(row), 16):
            block = [Fraction(v) for v in row[start:start + 16]]
            # torchao's max_abs / 6.0 on the B200: CUDA multiplies by fp32(1/6) (tests/cuda_torch.py)
            block_scale = fp32(max(abs(v) for v in block) * fp32(Fraction(1, 6)))
            if global_scale is None:
                code, value = ue4m3(block_scale)
                reciprocal = fp32(1 / value)
            else:
                code, value = ue4m3(fp32(block_scale / global_scale))
                reciprocal = fp32(fp32(1 / global_scale) / value)
            row_scales.append(code)
            for v in block:
                scaled = fp32(v * reciprocal)
                scaled = min(max(scaled, Fraction(-6)), Fraction(6))
                row_codes.append(rne_saturate(scaled if scaled != 0 or v >= 0 else -0.0, "e2m1"))
        codes.append(row_codes)
        scales.append(row_scales)
    return np.array(codes, np.uint8), np.array(scales, np.uint8)


# ---------------------------------------------------------------------------------------------------------------
# Inputs


def random_rows(seed, rows=6, cols=64, spread=40):
    """fp32 rows whose blocks span many binades (and reach the fp32 subnormals)."""
    rng = np.random.default_rng(seed)
    magnitude = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-spread, spread, (rows, cols // 32, 1))
                                                             ).repeat(32, axis=2).reshape(rows, cols)
    return magnitude.astype(np.float32)


def adversarial_rows(fmt):
    """Zero blocks, one huge value, NaN/Inf, exact ties of the element grid, element and fp32 subnormals."""
    values, _ = GRIDS[fmt]
    top = float(values[-1])
    ties = [float((a + b) / 2) for a, b in zip(values, values[1:])]
    blocks = [
        [0.0] * 32,
        [-0.0] * 31 + [1.0],
        [3.0e38] + [1.0] * 31,
        [float(np.finfo(np.float32).max)] + [-1e-30] * 31,
        [math.inf] + [2.0] * 31,
        [1.0] * 30 + [math.nan, -math.inf],
        ([top] + ties + [-t for t in ties])[:32] + [0.0] * max(0, 32 - 1 - 2 * len(ties)),
        [top * 1.0625] + [-top * 0.96875] + [top / 3] * 30,
        [float(np.float32(2.0 ** -149))] * 16 + [float(np.float32(2.0 ** -127)) * 3] * 16,
        [float(values[1]) * 2.0 ** -9 * k for k in range(32)],
        [2.0 ** -120 * (1 + k / 32) for k in range(32)],
        [(1.9999 - k / 1000) * 2.0 ** 5 for k in range(32)],
    ]
    blocks = [(b + [0.0] * 32)[:32] for b in blocks]
    return np.array(blocks, np.float32).reshape(-1, 64)


def as_floats(array):
    return [[float(v) for v in row] for row in array]


# ---------------------------------------------------------------------------------------------------------------
# MX


@pytest.mark.parametrize("mode", bq.SCALING_MODES)
@pytest.mark.parametrize("fmt", bq.MX_FORMATS)
def test_mx_matches_the_derivation(fmt, mode):
    for rows in (random_rows(bq.MX_FORMATS.index(fmt) * 10 + bq.SCALING_MODES.index(mode)), adversarial_rows(fmt)):
        q = bq.quantize_mx(rows, fmt, scaling_mode=mode)
        codes, scales = oracle_mx(as_floats(rows), fmt, mode)
        np.testing.assert_array_equal(q.scales, scales, err_msg=f"{fmt} {mode} scales")
        got = formats.unpack_fp4(q.codes) if fmt == "e2m1" else q.codes
        mismatch = np.argwhere(got != codes)
        assert mismatch.size == 0, (f"{fmt} {mode}: x={rows[tuple(mismatch[0])]!r} got {got[tuple(mismatch[0])]:#x} "
                                    f"expected {codes[tuple(mismatch[0])]:#x}")


def test_mx_torch_inputs_bf16_and_outputs():
    x = torch.from_numpy(random_rows(3)).to(torch.bfloat16)
    q = bq.quantize_mx(x, "e4m3")
    assert q.codes.dtype == torch.float8_e4m3fn and q.scales.dtype == torch.float8_e8m0fnu
    assert q.scales.shape == (6, 2)
    codes, scales = oracle_mx(as_floats(x.float().numpy()), "e4m3", "floor")
    np.testing.assert_array_equal(q.codes.view(torch.uint8).numpy(), codes)
    np.testing.assert_array_equal(q.scales.view(torch.uint8).numpy(), scales)
    fp4 = bq.quantize_mx(x, "e2m1")
    assert fp4.codes.shape == (6, 32) and fp4.codes.dtype == getattr(torch, "float4_e2m1fn_x2", torch.uint8)
    assert bq.quantize_mx(x, "e3m2").codes.dtype == torch.uint8


def test_mx_dequantises_to_the_scaled_grid():
    rows = random_rows(4)
    q = bq.quantize_mx(rows, "e4m3")
    values = bq.dequantize_blocks(q)
    scale = formats.decode_scales(q.scales, "ue8m0").repeat(32, axis=1)
    np.testing.assert_array_equal(values, formats.decode(q.codes, "e4m3") * scale)
    # "ceil" never saturates: each value lies within half an e4m3 step (relative 2**-4, or the subnormal step).
    q = bq.quantize_mx(rows, "e4m3", scaling_mode="ceil")
    values, scale = bq.dequantize_blocks(q), formats.decode_scales(q.scales, "ue8m0").repeat(32, axis=1)
    assert np.all(np.abs(values - rows) <= np.abs(rows) * 2.0 ** -4 + scale * 2.0 ** -10)


def test_swizzled_scales_are_the_plain_scales_in_32_4_4_order():
    x = torch.from_numpy(random_rows(5, rows=130, cols=160))
    plain, swizzled = bq.quantize_mx(x, "e4m3"), bq.quantize_mx(x, "e4m3", swizzle=True)
    assert swizzled.swizzled and swizzled.scales.shape == (scale_layout.blocked_shape(130, 5).numel,)
    assert torch.equal(swizzled.scales.view(torch.uint8), scale_layout.to_blocked(plain.scales).view(torch.uint8))
    np.testing.assert_array_equal(bq.dequantize_blocks(swizzled), bq.dequantize_blocks(plain))


def test_refusals():
    with pytest.raises(bq.BlockQuantizeError, match="rceil"):
        bq.quantize_mx(np.zeros((1, 32), np.float32), scaling_mode="rceil")
    with pytest.raises(bq.BlockQuantizeError, match="scaling_mode"):
        bq.quantize_mx(np.zeros((1, 32), np.float32), scaling_mode="nearest")
    with pytest.raises(bq.BlockQuantizeError, match="block_size"):
        bq.quantize_mx(np.zeros((1, 32), np.float32), block_size=16)
    with pytest.raises(bq.BlockQuantizeError, match="multiple of the block size 32"):
        bq.quantize_mx(np.zeros((1, 40), np.float32))
    with pytest.raises(bq.BlockQuantizeError, match="MX format"):
        bq.quantize_mx(np.zeros((1, 32), np.float32), "e4m3fnuz")
    with pytest.raises(bq.BlockQuantizeError, match="float32"):
        bq.quantize_mx(torch.zeros(1, 32, dtype=torch.float64))
    with pytest.raises(bq.BlockQuantizeError, match="global_scale"):
        bq.quantize_nvfp4(np.zeros((1, 16), np.float32), global_scale="amax")
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(bq.BlockQuantizeError, match="positive and finite"):
            bq.quantize_nvfp4(np.zeros((1, 16), np.float32), global_scale=bad)


# ---------------------------------------------------------------------------------------------------------------
# NVFP4


def nvfp4_rows(seed):
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((4, 64)) * np.exp2(rng.integers(-20, 20, (4, 4, 1))).repeat(16, axis=2).reshape(4, 64)
    rows[0, :16] = 0.0
    rows[1, :16] = [6.0 * 2.0 ** -6 * k / 4 for k in range(16)]  # ties of the e2m1 grid at the smallest scale
    rows[2, 16:32] = [1e30] + [1e-30] * 15
    rows[3, :16] = np.float32(2.0 ** -140)
    return rows.astype(np.float32)


@pytest.mark.parametrize("global_scale", [None, "dynamic", 2.0 ** -10, 0.3])
def test_nvfp4_matches_the_derivation(global_scale):
    rows = nvfp4_rows(7)
    q = bq.quantize_nvfp4(rows, global_scale=global_scale)
    g = q.global_scale
    if global_scale == "dynamic":
        # torchao's amax / 2688.0 on the B200: CUDA's amax * fp32(1/2688)
        assert g == float(np.float32(np.abs(rows).max()) * (np.float32(1.0) / np.float32(2688.0)))
    codes, scales = oracle_nvfp4(as_floats(rows), None if g is None else Fraction(g))
    np.testing.assert_array_equal(q.scales, scales)
    np.testing.assert_array_equal(formats.unpack_fp4(q.codes), codes)


def test_nvfp4_special_values():
    rows = np.ones((1, 48), np.float32)
    rows[0, 3] = np.nan
    rows[0, 20] = -np.inf
    q = bq.quantize_nvfp4(rows, global_scale=None)
    assert q.scales[0, 0] == 0x7F  # NaN block scale
    assert q.scales[0, 1] == 0x7E  # an infinite amax clamps to 448
    unpacked = formats.unpack_fp4(q.codes)[0]
    assert unpacked[20] == 0xF and np.all(unpacked[16:20] == 0)  # -Inf saturates; 1/448 * 1 rounds to 0
    zero = bq.quantize_nvfp4(np.zeros((1, 16), np.float32))  # dynamic global scale 0: NaN scales, as torchao
    assert zero.global_scale == 0.0 and zero.scales[0, 0] == 0x7F


# ---------------------------------------------------------------------------------------------------------------
# torchao itself (when installed: pip install --no-deps torchao==0.18.0; MMAEMU_TEST_REQUIRE_TORCHAO=1 turns the
# skip into a failure)

TORCHAO_VERSION = "0.18.0"


def _torchao():
    required = os.environ.get("MMAEMU_TEST_REQUIRE_TORCHAO") == "1"
    try:
        import torchao
    except ImportError as error:
        if required:
            pytest.fail(f"MMAEMU_TEST_REQUIRE_TORCHAO=1 but torchao does not import: {error}")
        pytest.skip("torchao is not installed (pip install --no-deps torchao==0.18.0)")
    if torchao.__version__.split("+")[0] != TORCHAO_VERSION:
        message = f"the rules are pinned to torchao {TORCHAO_VERSION}, installed: {torchao.__version__}"
        pytest.fail(message) if required else pytest.skip(message)
    from torchao.prototype.mx_formats import config, mx_tensor, nvfp4_tensor

    return config, mx_tensor, nvfp4_tensor


@pytest.mark.parametrize("fmt", bq.MX_FORMATS)
def test_mx_equals_torchao(fmt):
    config, mx_tensor, _ = _torchao()
    dtypes = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m3": "fp6_e2m3", "e3m2": "fp6_e3m2",
              "e2m1": torch.float4_e2m1fn_x2}
    x = torch.from_numpy(np.concatenate([random_rows(11, rows=8), adversarial_rows(fmt)]))
    for mode in bq.SCALING_MODES:
        scales, data = mx_tensor.to_mx(x.clone(), dtypes[fmt], 32, getattr(config.ScaleCalculationMode,
                                                                             mode.upper()))
        q = bq.quantize_mx(x, fmt, scaling_mode=mode)
        np.testing.assert_array_equal(q.scales.view(torch.uint8).numpy(), scales.view(torch.uint8).numpy())
        got, want = q.codes.view(torch.uint8).numpy(), data.view(torch.uint8).numpy()
        if fmt == "e2m1":
            got, want = formats.unpack_fp4(got), formats.unpack_fp4(want)
        # In NaN-scale blocks (which decode to NaN whatever their codes) torchao's FP6/FP4 codes are unspecified
        # and its FP8 NaN codes carry the sign the CPU gives the NaN; only the FP8 magnitudes are compared there.
        nan_block = (q.scales.view(torch.uint8).numpy() == 0xFF).repeat(32, axis=1)
        np.testing.assert_array_equal(got[~nan_block], want[~nan_block], err_msg=f"{fmt} {mode}")
        if fmt in ("e4m3", "e5m2"):
            np.testing.assert_array_equal(got[nan_block] & 0x7F, want[nan_block] & 0x7F, err_msg=f"{fmt} {mode}")


@pytest.mark.parametrize("two_level", [False, True])
def test_nvfp4_equals_torchao(two_level):
    _, _, nvfp4_tensor = _torchao()
    x = torch.from_numpy(np.concatenate([nvfp4_rows(12), random_rows(13, rows=4, spread=10)]))
    with CudaScalarDivision():  # torchao's source with the B200's division by a Python number
        pts = nvfp4_tensor.per_tensor_amax_to_scale(torch.max(torch.abs(x))) if two_level else None
        scales, data = nvfp4_tensor.nvfp4_quantize(x.clone(), 16, pts)
    q = bq.quantize_nvfp4(x, global_scale="dynamic" if two_level else None)
    if two_level:
        assert q.global_scale == float(pts)
    np.testing.assert_array_equal(q.scales.view(torch.uint8).numpy(), scales.view(torch.uint8).numpy())
    np.testing.assert_array_equal(q.codes.view(torch.uint8).numpy(), data.view(torch.uint8).numpy())


def test_flush_to_zero_mode_is_refused():
    """Subnormal fp32 amaxes and quotients would be flushed: refused with the cast's error, computing nothing."""
    from mmaemu.errors import MmaemuError

    x = np.full((1, 32), 2.0 ** -140, np.float32)
    want = bq.quantize_mx(x, "e4m3").codes
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        for call in (lambda: bq.quantize_mx(x, "e4m3"), lambda: bq.quantize_nvfp4(x)):
            with pytest.raises(MmaemuError, match=r"set_flush_denormal\(False\)"):
                call()
    finally:
        torch.set_flush_denormal(False)
    np.testing.assert_array_equal(bq.quantize_mx(x, "e4m3").codes, want)


@pytest.mark.parametrize("fmt", bq.MX_FORMATS)
def test_rounding_at_every_grid_point_tie_and_neighbour(fmt):
    """Every grid value, every midpoint of two neighbours and the fp32 values one ulp either side of them, both
    signs, beyond the maximum, and the fp32 subnormals."""
    values, _ = GRIDS[fmt]
    points = [float(v) for v in values] + [float((a + b) / 2) for a, b in zip(values, values[1:])]
    points += [float(values[-1]) * 1.5, float(values[-1]) * 2, 3e38, math.inf, 2.0 ** -149, 2.0 ** -130]
    y = np.array(points, np.float32)
    y = np.concatenate([y, np.nextafter(y, np.float32(np.inf)), np.nextafter(y, np.float32(0))])
    y = np.concatenate([y, -y])
    want = [rne_saturate(exact(float(v)) if v != 0 else float(v), fmt) for v in y]
    np.testing.assert_array_equal(bq.round_to_format(y, fmt), np.array(want, np.uint8))


def rne_saturate_array(y, fmt):
    """:func:`rne_saturate` of every fp32 value of ``y`` at once (the test's own grid in float64, numpy's
    searchsorted), for sweeps too large for Fractions."""
    ebits, mbits = LAYOUT[fmt]
    values = np.array([float(v) for v in GRIDS[fmt][0]])
    codes = np.array(GRIDS[fmt][1])
    nan = np.isnan(y)
    magnitude = np.minimum(np.abs(np.where(nan, 0, y)).astype(np.float64), values[-1])
    above = np.minimum(np.searchsorted(values, magnitude), values.size - 1)
    below = np.maximum(above - 1, 0)
    middle = (values[below] + values[above]) / 2
    up = (values[above] == magnitude) | (magnitude > middle) | ((magnitude == middle) & (codes[above] % 2 == 0))
    code = np.where(up, codes[above], codes[below]) | np.where(np.signbit(y), 1 << (ebits + mbits), 0)
    return np.where(nan, 0x7F if ebits + mbits == 7 else 0, code).astype(np.uint8)


@pytest.mark.parametrize("fmt", bq.MX_FORMATS)
def test_rounding_over_a_sweep_of_every_fp32_exponent_and_high_fraction(fmt):
    """The compiled rounding (its code read off the fp32 bits, mmaemu.arith.rounding.grid_code) on every fp32 bit
    pattern whose low 16 bits are one of six patterns (ties and their neighbours have low bits 0, 1 and 0xFFFF):
    every exponent (fp32 subnormals, both zeros, Inf, quiet and signalling NaNs of both signs), every high
    fraction."""
    high = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    bits = np.concatenate([high | np.uint32(low) for low in (0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF)])
    y = bits.view(np.float32)
    with np.errstate(invalid="ignore"):
        want = rne_saturate_array(y, fmt)
    np.testing.assert_array_equal(bq.round_to_format(y, fmt), want)
    np.testing.assert_array_equal(bq.round_to_format(y.reshape(-1, 64), fmt), want.reshape(-1, 64))

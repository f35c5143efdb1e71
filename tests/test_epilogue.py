"""The epilogue's arithmetic (mmaemu.arith.epilogue: a float64 product, an fp32 conversion, integer RNE on fp32
bits) against the integer rounding of mmaemu.arith.rounding and against the independent oracle (tests/oracle.py).

* :func:`narrow_bits` on every fp32 sign and exponent field, with the low bits that decide a rounding (zero, one,
  just below half, half, just above, all ones) under many kept fraction bits, for every narrower output format;
* the whole :func:`epilogue_one` on random accumulator bits and adversarial alphas, against the same integer rules;
* the whole epilogue on constructed edge cases (signed zeros, subnormals, ties, overflow, NaN, Inf) against the
  oracle's exact rational arithmetic, every output dtype, with and without scale_result.
"""

import numpy as np
import pytest
from numba import njit

from mmaemu.arith import epilogue
from mmaemu.arith.rounding import BFLOAT16, E4M3, E5M2, FLOAT16, FLOAT32, round_float32, round_to_format, \
    value_of_bits

import oracle

OUT_NAMES = ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"]
NARROW = {"bfloat16": (BFLOAT16, np.inf), "float16": (FLOAT16, np.inf), "float8_e4m3fn": (E4M3, 448.0),
          "float8_e5m2": (E5M2, np.inf)}


def structured_fp32_bits(frac_bits):
    """fp32 patterns (uint32) of every sign and exponent field, each with 97 kept-fraction values (0, the largest
    and random ones) times the dropped low bits 0, 1, half - 1, half, half + 1, all ones and 10 random ones (NaN patterns left out)."""
    dropped = 23 - frac_bits
    half = 1 << (dropped - 1)
    rng = np.random.default_rng(frac_bits)
    lows = np.concatenate([[0, 1, half - 1, half, half + 1, (1 << dropped) - 1],
                           rng.integers(0, 1 << dropped, 10)]).astype(np.uint32)
    kept_max = (1 << frac_bits) - 1
    kept = np.unique(np.concatenate([[0, 1, kept_max], rng.integers(0, kept_max + 1, 94)])).astype(np.uint32)
    fields = np.arange(256, dtype=np.uint32)
    signs = np.array([0, 1], np.uint32)
    bits = (signs[:, None, None, None] << 31) | (fields[None, :, None, None] << 23) \
        | (kept[None, None, :, None] << dropped) | lows[None, None, None, :]
    bits = bits.reshape(-1)
    nan = ((bits >> 23) & 0xFF == 0xFF) & (bits & 0x7FFFFF != 0)
    return bits[~nan]


@njit
def narrow_mismatches(bits, fmt, largest):
    """Indices where narrow_bits differs from round_to_format (values with |y| <= largest)."""
    found = []
    values = bits.view(np.float32)
    for i in range(values.size):
        y = values[i]
        if abs(y) > largest:
            continue
        if epilogue.narrow_bits(y, fmt) != round_to_format(np.float64(y), fmt):
            found.append(i)
    return found


@pytest.mark.parametrize("out", list(NARROW))
def test_narrow_bits_is_the_integer_rounding_on_every_exponent_and_tie(out):
    fmt, largest = NARROW[out]
    bits = structured_fp32_bits(fmt[0])
    assert bits.size > 30_000
    assert list(narrow_mismatches(bits, fmt, largest)) == []


@njit
def integer_epilogue(acc, alpha, out_code, scale_result, has_scale_result):
    """The epilogue written with the integer rounding only (round_float32, round_to_format), semantics.md (e)."""
    p = np.float64(acc) * alpha
    if p != p:
        y = p
    elif p == 0.0:
        y = 0.0
    else:
        y = round_float32(p)
    if out_code >= 3:
        if has_scale_result:
            y = round_float32(y * scale_result)
        if y != y:
            return 0x7F
        if out_code == 3:
            return round_to_format(min(max(y, -448.0), 448.0), E4M3)
        return round_to_format(min(max(y, -57344.0), 57344.0), E5M2)
    if y != y:
        return 0x7FFFFFFF if out_code == 0 else 0x7FFF
    return round_to_format(y, (FLOAT32, BFLOAT16, FLOAT16)[out_code])


@njit
def epilogue_mismatches(acc, alpha, out_code, scale_result, has_scale_result):
    found = []
    for i in range(acc.size):
        got = epilogue.epilogue_one(acc[i], alpha, out_code, scale_result, has_scale_result)
        if got != integer_epilogue(acc[i], alpha, out_code, scale_result, has_scale_result):
            found.append(i)
    return found


ALPHAS = [1.0, -1.0, 2.0**-7, 2.0**-130, 2.0**-149, 2.0**100, -(2.0**127), float(np.float32(1 / 3)), 0.0, -0.0,
          np.inf, -np.inf, np.nan]


@pytest.mark.parametrize("alpha", ALPHAS)
def test_epilogue_one_is_the_integer_epilogue_on_random_accumulators(alpha):
    rng = np.random.default_rng(7)
    acc = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    for out_code in range(5):
        for scale_result, has in ((1.0, False), (float(np.float32(0.3)), True), (-0.0, True), (2.0**-140, True),
                                  (np.inf, True)):
            assert list(epilogue_mismatches(acc, alpha, out_code, scale_result, has)) == [], (out_code, scale_result)


def f32_bits(x) -> int:
    return int(np.array([x], np.float32).view(np.uint32)[0])


def edge_accumulators():
    """fp32 accumulator patterns at the edges: zeros, subnormals, the normal boundary, values whose product with
    the alphas below is a bf16/fp16/FP8 tie or lands next to one, the largest finite, Inf, NaN."""
    values = [0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,
              0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001]
    for base in (1.0, 1.5, 448.0, 464.0, 57344.0, 61440.0, 65504.0, 65520.0, 2.0**-14, 2.0**-24, 2.0**-9, 2.0**-16,
                 2.0**-133):
        b = f32_bits(base)
        for delta in (-(1 << 13), -(1 << 12), -1, 0, 1, 1 << 12, 1 << 13, 1 << 15, (1 << 16) - 1, 1 << 16,
                      (1 << 19), (1 << 20), (1 << 21)):
            for sign in (0, 0x80000000):
                values.append(((b + delta) & 0x7FFFFFFF) | sign)
    return sorted(set(values))


SCALE_PAIRS = [(1.0, 1.0), (2.0**-100, 2.0**-49), (-(2.0**-64), 2.0**-64), (2.0**64, 2.0**64), (-1.0, 0.0),
               (np.inf, 1.0), (np.nan, 1.0), (float(np.float32(1 / 3)), 3.0)]


@pytest.mark.parametrize("out", OUT_NAMES)
def test_epilogue_is_the_oracle_on_edge_cases(out):
    out_code = epilogue.OUT_CODES[out]
    for scale_a, scale_b in SCALE_PAIRS:
        sa, sb = f32_bits(scale_a), f32_bits(scale_b)
        alpha = epilogue.scale_product(value_of_bits(np.int64(sa), FLOAT32), value_of_bits(np.int64(sb), FLOAT32))
        for scale_result in (None, 0.5, -3.0, 2.0**-140):
            sr = None if scale_result is None else f32_bits(scale_result)
            sr_value = 1.0 if sr is None else float(value_of_bits(np.int64(sr), FLOAT32))
            for acc_bits in edge_accumulators():
                acc = np.array([acc_bits], np.uint32).view(np.float32)[0]
                got = int(epilogue.epilogue_one(acc, alpha, out_code, sr_value, sr is not None))
                want = oracle.epilogue(acc_bits, sa, sb, sr, out)
                assert got == want, (out, scale_a, scale_b, scale_result, hex(acc_bits), hex(got), hex(want))


def test_step_two_signs_of_zero():
    """An exactly zero product gives +0 (alpha -0, acc -0); a tiny negative product keeps its sign."""
    assert epilogue.epilogue_one(np.float32(1.0), -0.0, epilogue.OUT_FLOAT32, 1.0, False) == 0
    assert epilogue.epilogue_one(np.float32(-0.0), 1.0, epilogue.OUT_FLOAT32, 1.0, False) == 0
    assert epilogue.epilogue_one(np.float32(-0.25), 2.0**-149, epilogue.OUT_FLOAT32, 1.0, False) == 0x80000000
    assert epilogue.epilogue_one(np.float32(-0.75), 2.0**-149, epilogue.OUT_FLOAT32, 1.0, False) == 0x80000001


@pytest.mark.parametrize("out", OUT_NAMES)
def test_epilogue_span_is_epilogue_one_per_output(out):
    """The vectorised loop of a row (one loop per output code) gives epilogue_one's bits, inside [lo, hi) only."""
    rng = np.random.default_rng(3)
    acc = rng.integers(0, 2**32, 50_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    out_code = epilogue.OUT_CODES[out]
    for alpha, scale_result, has in ((1.0, 1.0, False), (2.0**-130, 0.5, True), (-0.0, 1.0, False)):
        got = np.full(acc.size, 0xABCD, np.int64)
        epilogue.epilogue_span(acc, got, 5, acc.size - 7, alpha, out_code, scale_result, has)
        want = [epilogue.epilogue_one(x, alpha, out_code, scale_result, has) for x in acc[5:-7]]
        assert got[5:-7].tolist() == want
        assert set(got[:5].tolist()) | set(got[-7:].tolist()) == {0xABCD}

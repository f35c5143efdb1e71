"""The offset formulation (mmaemu.arith.offset, the arithmetic of the cuda:offset kernel) equals the reference path
(accumulate_one) bit for bit, and its packed primitives (mmaemu.arith.packed, mmaemu.arith.bf16) are the functions
they claim.

The integer primitives' twins are checked against Python integers, the bf16x2 fused multiply-add against exact
rationals (ties both ways, the overflow threshold, subnormals, signed zeros); the fp16 stand-in for max.u16x2 below
sm_90 on both sides of its domain. The block step is checked against the reference on every format pair, with both
exponent passes for E4M3 x E4M3 (power sums, add-max), hopper, ada and custom presets at the edges of its
conditions (the 2**22 window, min_exp above the products), on random, wide spread, exactly cancelling and maximal
same-sign inputs, fast and slow, ragged K; against the independent oracle, the contract's accumulate vectors and
the Khattak-Mikaitis hardware recordings. Each exactness condition of mmaemu/arith/offset.py and
mmaemu/arith/power_sums.py is tested on both sides of its bound: a mutation of the threshold byte, the zero bytes,
the absent exponent, the offset, the power encoding or the power sums' start makes a test fail
(test_mutations_are_caught, test_power_mutations_are_caught and the condition tests).
"""

import numpy as np
import pytest

from mmaemu.arith import bf16, offset, packed, power_sums
from mmaemu.cpu.engine import accumulate_codes
from mmaemu.model.presets import ADA, HOPPER, Preset

from test_engine_vs_oracle import accumulate_case
from test_fast_path import EXTREMES, PAIRS, cancelling_codes, random_codes, spread_codes
import oracle
from vectors import km_cases, spec_vectors

# The largest hopper-like block the window holds (32 * 2**16 + 2**15 <= 2**22) and the first it does not.
EDGE = Preset("offset-edge-32x14", nfma=32, frac=14, frac_out=14, min_exp=-132, late_c=False, slow_chunk=128)
OVER = Preset("offset-over-32x15", nfma=32, frac=15, frac_out=15, min_exp=-132, late_c=False, slow_chunk=128)
# frac_out above frac: the deferred truncation keeps more bits than each block's grid.
FINE_OUT = Preset("offset-16x10-out20", nfma=16, frac=10, frac_out=20, min_exp=-132, late_c=False, slow_chunk=128)
# min_exp above every product exponent: E, and so the grid, set by min_exp.
HIGH_MIN_EXP = Preset("offset-minexp20", nfma=16, frac=13, frac_out=13, min_exp=20, late_c=False, slow_chunk=128)
PRESETS = [HOPPER, ADA, EDGE, FINE_OUT, HIGH_MIN_EXP]


# ----------------------------------------------------------------------------------------------------------------
# The primitives


def _words(rng, n):
    edges = [0, 1, 0xFF, 0x80, 0x7F7F7F7F, 0x80808080, 0xFFFFFFFF, 0x01010101, 0xFFFF0000, 0x0000FFFF]
    return [int(x) for x in rng.integers(0, 2**32, n, dtype=np.uint64)] + edges


def test_dp4a_twin_is_the_byte_dot_product():
    rng = np.random.default_rng(1)
    a, b, c = _words(rng, 400), _words(rng, 400)[::-1], _words(rng, 410)
    for x, y, z in zip(a, b, c):
        want = (z + sum(((x >> s) & 0xFF) * ((y >> s) & 0xFF) for s in (0, 8, 16, 24))) % 2**32
        assert int(packed.dp4a_exact(np.uint32(x), np.uint32(y), np.uint32(z))) == want


def test_max_u16x2_twin():
    rng = np.random.default_rng(2)
    a, b = _words(rng, 400), _words(rng, 400)[::-1]
    for x, y in zip(a, b):
        want = max(x & 0xFFFF, y & 0xFFFF) | (max(x >> 16, y >> 16) << 16)
        assert int(packed.max_u16x2_exact(np.uint32(x), np.uint32(y))) == want


def test_add_u16x2_and_swap_halves_twins():
    rng = np.random.default_rng(4)
    a, b = _words(rng, 400), _words(rng, 400)[::-1]
    for x, y in zip(a, b):
        want = ((x + y) & 0xFFFF) | ((((x >> 16) + (y >> 16)) & 0xFFFF) << 16)
        assert int(packed.add_u16x2_exact(np.uint32(x), np.uint32(y))) == want
        assert int(packed.swap_halves(np.uint32(x))) == (x >> 16) | ((x & 0xFFFF) << 16)


def test_32_bit_add_equals_the_packed_one_exactly_without_carries():
    """add.u32 (the stand-in below sm_90) = add.u16x2 while the low halves' sum stays below 2**16, and not
    beyond (a high half-sum of 2**16 or more falls off the top in both)."""
    rng = np.random.default_rng(5)
    halves = rng.integers(0, 0x8000, (2000, 4))
    for h in np.concatenate([halves, [[0x7FFF, 0x7FFF, 0x8000, 0x8000], [0xFFFF, 0, 0, 0xFFFF]]]):
        x, y = int(h[0]) | (int(h[1]) << 16), int(h[2]) | (int(h[3]) << 16)
        assert packed.add_u32_model(x, y) == int(packed.add_u16x2_exact(np.uint32(x), np.uint32(y)))
    # A low half-sum of 2**16 or more carries into the high half.
    for x, y in ((0x0000_8000, 0x0000_8000), (0x0001_FFFF, 0x0000_0001)):
        assert packed.add_u32_model(x, y) != int(packed.add_u16x2_exact(np.uint32(x), np.uint32(y)))
    # Every exponent half of the formulation keeps its sums below 2**16 (condition 6).
    assert 2 * (offset.EXP_BIAS + 15) < 0x10000


def _exponent_sums(fa, fb):
    """{sum of two exponent halves: True if both are real} over every pair of codes of a format pair."""
    from mmaemu import formats

    out = {}
    halves_a, halves_b = offset.offset_tables(fa)[1], offset.offset_tables(fb)[1]
    real_a = np.isfinite(formats.values(fa)) & (np.array(formats.values(fa)) != 0)
    real_b = np.isfinite(formats.values(fb)) & (np.array(formats.values(fb)) != 0)
    for x in range(256):
        for y in range(256):
            out[int(halves_a[x]) + int(halves_b[y])] = bool(real_a[x] and real_b[y])
    return out


def exponent_patterns_disagree():
    """Condition 9 for every exponent sum of every format pair: a real sum's P is the pattern of 2**e, and a sum
    with an absent half gives a P below the floor (int32 order). Returns the number of disagreements."""
    bad = 0
    for fa, fb in PAIRS:
        params = offset.offset_params((32, 0, 0, 13, 13, -132, 0), fa, fb)
        p_shift, floor_bits = params.p_add, params.floor_bits
        for total, real in _exponent_sums(fa, fb).items():
            pattern = int(np.array(((total << 23) + p_shift) % 2**32, np.uint32).view(np.int32))
            if real:
                bad += pattern != (total - 2 * offset.EXP_BIAS + 127) << 23
            else:
                bad += pattern >= floor_bits
            # The halves meet the stand-ins' domains (condition 6).
            bad += not packed.F16_NORMAL_MIN <= total <= packed.F16_NORMAL_MAX
    return bad


def test_exponent_patterns_of_every_sum():
    assert exponent_patterns_disagree() == 0


@pytest.mark.parametrize("name,value", [("EXP_ABSENT", offset.EXP_BIAS - 256), ("EXP_ABSENT", offset.EXP_BIAS - 40),
                                        ("EXP_BIAS", 0x200)])
def test_exponent_pattern_bounds(monkeypatch, name, value):
    """EXP_ABSENT = EXP_BIAS - 256 reads two absent halves as E = 0; EXP_BIAS - 40 puts a sum with one absent
    half above small real ones; EXP_BIAS = 0x200 takes the absent sums below the fp16 stand-in's domain."""
    monkeypatch.setattr(offset, name, value)
    if name == "EXP_BIAS":
        monkeypatch.setattr(offset, "EXP_ABSENT", value - 128)
    assert exponent_patterns_disagree() > 0


def test_fp16_maximum_equals_the_unsigned_one_exactly_on_its_domain():
    """max.f16x2 (the stand-in below sm_90) = max.u16x2 on positive normal fp16 patterns, and not beyond them."""
    rng = np.random.default_rng(3)
    lo, hi = packed.F16_NORMAL_MIN, packed.F16_NORMAL_MAX
    inside = rng.integers(lo, hi + 1, (2000, 4))
    for h in np.concatenate([inside, [[lo, hi, hi, lo], [lo, lo, hi, hi]]]):
        x, y = int(h[0]) | (int(h[1]) << 16), int(h[2]) | (int(h[3]) << 16)
        assert packed.max_f16x2_model(x, y) == int(packed.max_u16x2_exact(np.uint32(x), np.uint32(y)))
    # Just outside: a negative pattern (sign bit) and an Inf pattern order differently.
    for x, y in ((0x8000_0400, 0x0400_0400), (0x7C00_7C00 + 1, 0x7BFF_7BFF)):
        assert packed.max_f16x2_model(x, y) != int(packed.max_u16x2_exact(np.uint32(x), np.uint32(y)))
    # Every exponent word sum of the formulation lies inside (condition 6).
    assert 2 * offset.EXP_ABSENT >= lo and 2 * (offset.EXP_BIAS + 15) <= hi


def test_load_words4_twin_reads_four_consecutive_words():
    words = np.arange(3 * 8, dtype=np.uint32).reshape(3, 8)
    assert packed.load_words4(words, np.uint32(2), np.uint32(4)) == (20, 21, 22, 23)


# ----------------------------------------------------------------------------------------------------------------
# The bf16x2 fused multiply-add against exact rationals


def bf16_fraction(half):
    """The exact value of a finite bf16 pattern (None for Inf and NaN)."""
    from fractions import Fraction

    exponent, mantissa = (half >> 7) & 0xFF, half & 0x7F
    if exponent == 0xFF:
        return None
    sign = -1 if half & 0x8000 else 1
    if exponent == 0:
        return sign * Fraction(mantissa, 128) * Fraction(2) ** -126
    return sign * (1 + Fraction(mantissa, 128)) * Fraction(2) ** (exponent - 127)


def bf16_round(x, negative_zero):
    """The bf16 pattern of the exact rational x rounded to nearest, ties to even (an exact zero: +0 or, with
    ``negative_zero``, -0; overflow: Inf), from integers alone."""
    from fractions import Fraction

    if x == 0:
        return 0x8000 if negative_zero else 0
    sign = 0x8000 if x < 0 else 0
    magnitude = abs(x)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    ulp = Fraction(2) ** (max(exponent, -126) - 7)
    units = magnitude / ulp
    whole = units.numerator // units.denominator
    rest = units - whole
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2):
        whole += 1
    if whole * ulp >= Fraction(2) ** 128:
        return sign | 0x7F80
    if whole * ulp < Fraction(2) ** -126:  # subnormal (or zero): ulp 2**-133
        return sign | whole
    field = max(exponent, -126) + 127 + (whole >= 256)  # rounding up to the next binade
    return sign | (field << 7) | (whole >> (whole >= 256)) & 0x7F


def bf16_fma_cases(rng):
    """(a, b, c) bf16 patterns: random finite ones, near-cancellations, ties both ways and just off them, the
    overflow threshold, subnormal and underflowing results, signed zeros."""
    finite = [h for h in range(0x10000) if (h >> 7) & 0xFF != 0xFF]
    cases = [tuple(int(v) for v in rng.choice(finite, 3)) for _ in range(800)]
    for _ in range(300):  # c near -a*b: cancellation, results far below the operands
        a, b = (int(v) for v in rng.choice(finite, 2))
        ea, eb = (a >> 7) & 0xFF, (b >> 7) & 0xFF
        field = min(max(ea + eb - 127 + int(rng.integers(-2, 3)), 1), 254)
        cases.append((a, b, (~(a ^ b) & 0x8000) | (field << 7) | int(rng.integers(0, 128))))
    one, half_ulp = 0x3F80, 0x3B80  # 1.0 and 2**-8, half its ulp
    for c in range(one, one + 8):  # ties to even (1.0 even, 1 + 2**-7 odd, ...) and just above or below a tie
        cases += [(half_ulp, one, c), (half_ulp, 0xBF80, c), (0x3B81, one, c), (0x3B7F, one, c), (half_ulp, 0x3F81, c)]
    cases += [(0x7F7F, one, 0x7B00), (0x7F7F, one, 0x7AFF), (0x7F7E, one, 0x7B00),  # max + half its ulp (2**119)
              (0xFF7F, one, 0xFB00), (0x7F7F, 0x4000, 0), (0x0001, 0x3F00, 0), (0x0001, 0x3F00, 0x0001),
              (0x0080, 0x3F00, 0), (0x0001, 0x3E80, 0x8000), (0x8001, 0x3F00, 0x8000), (0x0001, 0x0001, 0),
              (0, one, 0x8000), (0x8000, one, 0x8000), (0x3F80, 0x3F80, 0xBF80), (0xBF80, 0x3F80, 0x3F80),
              (0x0001, 0x3F80, 0x8001), (0x8000, 0x8000, 0x8000)]
    return cases


def test_fma_bf16_twin_against_exact_rationals():
    rng = np.random.default_rng(7)
    for a, b, c in bf16_fma_cases(rng):
        product_negative = bool((a ^ b) & 0x8000)
        want = bf16_round(bf16_fraction(a) * bf16_fraction(b) + bf16_fraction(c),
                          product_negative and bool(c & 0x8000))
        got = int(bf16.fma_bf16_exact(np.uint32(a), np.uint32(b), np.uint32(c)))
        assert got == want, (hex(a), hex(b), hex(c), hex(got), hex(want))
    # The boundaries on both sides: the largest finite plus half its ulp is a tie that rounds (to even) to Inf, just
    # below it stays finite; a tie between 1 and 1 + 2**-7 goes to 1, between 1 + 2**-7 and 1 + 2**-6 up.
    for (a, b, c), want in (((0x7F7F, 0x3F80, 0x7B00), 0x7F80), ((0x7F7F, 0x3F80, 0x7AFF), 0x7F7F),
                            ((0x7F7E, 0x3F80, 0x7B00), 0x7F7E), ((0x3B80, 0x3F80, 0x3F80), 0x3F80),
                            ((0x3B80, 0x3F80, 0x3F81), 0x3F82), ((0x3B81, 0x3F80, 0x3F80), 0x3F81)):
        assert int(bf16.fma_bf16_exact(np.uint32(a), np.uint32(b), np.uint32(c))) == want, (hex(a), hex(c))


def test_fma_bf16x2_twin_works_on_each_half_and_broadcasts():
    rng = np.random.default_rng(8)
    halves = [int(v) for v in rng.integers(0, 0x7F00, 300)]
    for i in range(0, 300 - 6, 6):
        a, b, c = (halves[i] | halves[i + 1] << 16, halves[i + 2] | halves[i + 3] << 16,
                   halves[i + 4] | halves[i + 5] << 16)
        word = int(bf16.fma_bf16x2_exact(np.uint32(a), np.uint32(b), np.uint32(c)))
        for shift in (0, 16):
            x, y, z = ((v >> shift) & 0xFFFF for v in (a, b, c))
            assert (word >> shift) & 0xFFFF == int(bf16.fma_bf16_exact(np.uint32(x), np.uint32(y), np.uint32(z)))
        assert int(bf16.low_halves_exact(np.uint32(a))) == (a & 0xFFFF) * 0x10001
        assert int(bf16.high_halves_exact(np.uint32(a))) == (a >> 16) * 0x10001


# ----------------------------------------------------------------------------------------------------------------
# The power sums (mmaemu.arith.power_sums), condition by condition


def power_sum(terms):
    """The bf16 power sum of ``terms`` (bf16 patterns of products) from POWER_START, one fma per term (x * 1.0)."""
    total = np.uint32(power_sums.POWER_START)
    for t in terms:
        total = bf16.fma_bf16_exact(np.uint32(t), np.uint32(0x3F80), total)
    return int(total)


def power_readings_disagree(max_terms, rng_seed=3):
    """Condition 11 and 13 from the tables: for every exponent sum s of two E4M3 codes, a block of ``max_terms``
    products of exponent sum s among smaller products and absent terms, in a random order, read through
    power_product_bits: the exponent field must be s + 127 (the floor and |c| left aside). Returns the number of
    blocks read wrongly."""
    from mmaemu import formats

    rng = np.random.default_rng(rng_seed)
    exps = np.array(formats.exponents("e4m3"), np.int64)
    powers = offset.offset_tables("e4m3", offset.POWER_SUMS)[1]
    by_exponent = {int(e): int(code) for code, e in enumerate(exps) if powers[code]}
    add = np.int32(power_sums.power_add())
    bad = 0
    for ea in range(-6, 9):
        for eb in range(-6, 9):
            top = [powers[by_exponent[ea]]] * 2
            product = int(bf16.fma_bf16_exact(np.uint32(top[0]), np.uint32(powers[by_exponent[eb]]), np.uint32(0)))
            smaller = [int(bf16.fma_bf16_exact(np.uint32(powers[by_exponent[x]]), np.uint32(powers[by_exponent[y]]),
                                               np.uint32(0)))
                       for x in range(-6, 9) for y in range(-6, 9) if x + y < ea + eb]
            terms = [product] * max_terms + [0] * 3 + list(rng.choice(smaller, 5)) if smaller else [product] * max_terms
            rng.shuffle(terms)
            sums = power_sum(terms)
            for high in (0, 1):
                bits = int(power_sums.power_product_bits(np.uint32(sums << (16 * high)), high, add))
                bad += (bits >> 23) != ea + eb + 127
    return bad


def test_powers_and_products_are_exact_normal_bf16():
    """Condition 10: each E4M3 code's power is 2**(8e - 7) exactly (e its exponent, emin for subnormals; +0 for
    zero, NaN and Inf codes), and every product of two powers is the exact normal bf16 2**(8(ea + eb) - 14)."""
    from mmaemu import formats

    powers = offset.offset_tables("e4m3", offset.POWER_SUMS)[1]
    values, exps = formats.values("e4m3"), formats.exponents("e4m3")
    for code in range(256):
        if not np.isfinite(values[code]) or values[code] == 0:
            assert powers[code] == 0
            continue
        assert bf16_fraction(int(powers[code])) == 2 ** (8 * int(exps[code]) - 7)
    for x in set(int(p) for p in powers if p):
        for y in set(int(p) for p in powers if p):
            product = int(bf16.fma_bf16_exact(np.uint32(x), np.uint32(y), np.uint32(0)))
            assert bf16_fraction(product) == bf16_fraction(x) * bf16_fraction(y) and product >> 7 & 0xFF
    # E5M2's range does not fit: its powers are refused by the tables.
    with pytest.raises(ValueError):
        offset.offset_tables("e5m2", offset.POWER_SUMS)


@pytest.mark.parametrize("max_terms", [1, 2, 31, 32, 33, power_sums.POWER_TERMS])
def test_power_sums_read_the_largest_exponent_up_to_the_term_bound(max_terms):
    """Conditions 11 and 13 below the bound: up to POWER_TERMS = 127 copies of the largest product."""
    assert power_readings_disagree(max_terms) == 0


def test_power_sums_term_bound_is_tight():
    """Condition 11 beyond the bound: 128 copies of the largest product sum to the next multiple of 8 in the
    exponent field and read one too high; the exponent pass is not used for longer blocks."""
    assert power_readings_disagree(power_sums.POWER_TERMS + 1) > 0
    assert offset.exponent_method("e4m3", "e4m3", power_sums.POWER_TERMS) == offset.POWER_SUMS
    assert offset.exponent_method("e4m3", "e4m3", power_sums.POWER_TERMS + 1) == offset.ADD_MAX
    assert offset.exponent_method("e4m3", "e5m2", 32) == offset.ADD_MAX


def empty_power_reading(start):
    """power_product_bits of a power sum from ``start`` over absent terms only, and the hopper floor's pattern."""
    from mmaemu.arith.params import preset_params

    params = offset.offset_params(preset_params(HOPPER, "e4m3", "e4m3"), "e4m3", "e4m3", offset.POWER_SUMS)
    total = np.uint32(start)
    for _ in range(32):
        total = bf16.fma_bf16_exact(np.uint32(0), np.uint32(0x3F80), total)  # an absent (+0) term
    total = np.uint32(int(total) * 0x10001)
    readings = [int(power_sums.power_product_bits(total, high, np.int32(params.p_add))) for high in (0, 1)]
    return readings, params.floor_bits


@pytest.mark.parametrize("start,below_floor", [(power_sums.POWER_START, True), (0x0000, False), (0x8000, False)])
def test_blocks_without_products_read_below_the_floor(start, below_floor):
    """Conditions 12-13: from -2**-126, a sum of absent terms reads 2**-46, below every floor; from +0 it reads
    2**-14, and from -0 too (the first absent term gives +0 + -0 = +0): only a nonzero negative start works."""
    readings, floor_bits = empty_power_reading(start)
    assert all((r < floor_bits) == below_floor for r in readings), (hex(start), readings, floor_bits)


@pytest.mark.parametrize("name,value", [
    ("POWER_OFFSET", -6),  # 32 equal products cross a multiple of 8 in the exponent field
    ("POWER_OFFSET", -8),  # two do
    ("POWER_SPACING", 7),  # the field no longer divides by 8
])
def test_power_mutations_are_caught(monkeypatch, name, value):
    """A wrong power encoding misreads E in the sums (conditions 10-11) and, where a block's products show it, in
    the block step."""
    monkeypatch.setattr(power_sums, name, value)
    assert power_readings_disagree(32) > 0, f"{name} = {value} went unnoticed by the sums"
    if name == "POWER_SPACING":
        assert _fails(monkeypatch, power_sums, name, value, offset.POWER_SUMS), f"{name} = {value} went unnoticed"


def test_paired_words_hold_row_pairs():
    """The paired layout (offset_pack): word (w, 2p + i) holds the powers of rows 2p and 2p + 1 at k = 2w + i, zero
    codes past the rows and past K."""
    rng = np.random.default_rng(12)
    codes = random_codes(rng, "e4m3", (5, 10))
    val, exp, byte_words = packed_operand(codes, "e4m3", 10, offset.POWER_SUMS)
    powers = offset.offset_tables("e4m3", offset.POWER_SUMS)[1]

    def power(row, k):
        return int(powers[codes[row, k]]) if row < 5 and k < 10 else 0

    for w in range(exp.shape[0]):
        for column in range(exp.shape[1]):
            first, k = column - column % 2, 2 * w + column % 2
            assert int(exp[w, column]) == power(first, k) | power(first + 1, k) << 16, (w, column)


def test_tables_against_the_formats():
    """Values, exponent halves, low bytes (lowest set bit) and sign bytes of every code, from exact integers."""
    from fractions import Fraction

    from mmaemu import formats

    for fmt in ("e4m3", "e5m2"):
        values, exps, lows, signs = offset.offset_tables(fmt)
        la_min, r = offset.format_low_range(fmt)
        seen = set()
        for code in range(256):
            v = formats.values(fmt)[code]
            if not np.isfinite(v) or v == 0:
                assert (values[code], exps[code], lows[code], signs[code]) == (0, offset.EXP_ABSENT,
                                                                               offset.ZERO_LOW, 0)
                continue
            q = Fraction(abs(v))
            la = 0
            while (q / Fraction(2) ** la).denominator == 1:
                la += 1
            while (q / Fraction(2) ** la).denominator != 1:
                la -= 1
            assert values[code] == np.float32(v) and lows[code] == la - la_min
            assert exps[code] == formats.exponents(fmt)[code] + offset.EXP_BIAS
            assert signs[code] == (offset.SIGN_BYTE if v < 0 else 0)
            seen.add(int(lows[code]))
        assert min(seen) == 0 and max(seen) == r
    lows = offset.offset_tables("e4m3", offset.POWER_SUMS)[2]
    assert lows[0] == offset.POWER_ZERO_LOW and np.array_equal(lows[1:127], offset.offset_tables("e4m3")[2][1:127])


# ----------------------------------------------------------------------------------------------------------------
# The block step against the reference


def packed_operand(codes, fmt, K, method=offset.ADD_MAX):
    """Staged (val, exp, byte words) arrays of the codes, k-major, K padded to whole passes and the rows to whole
    vectors of four words (offset_pack_rows; zero codes in the padding)."""
    Kp = max(offset.K_PASS, -(-K // offset.K_PASS) * offset.K_PASS)
    rows = -(-codes.shape[0] // 4) * 4
    arrays = (np.zeros((Kp, rows), np.float32), np.zeros((Kp // 2, rows), np.uint32),
              np.zeros((Kp // 4, 2 * rows), np.uint32))
    offset.offset_pack_rows(codes, tuple(offset.offset_tables(fmt, method)), *arrays, method == offset.POWER_SUMS)
    return arrays


def block_step(method):
    return offset.power_offset_block if method == offset.POWER_SUMS else offset.offset_block


def methods(fmt_a, fmt_b, preset):
    """The exponent passes the kernel may run for a format pair: the power sums where they apply, and add-max
    (every pair; E4M3 x E4M3 below sm_80)."""
    return sorted({offset.exponent_method(fmt_a, fmt_b, preset.nfma), offset.ADD_MAX})


def offset_accumulate(a, b, fmt_a, fmt_b, preset, fast, c=None, method=None):
    """Accumulators [M, N] of the finite path by the block step: one chain over K (fast) or a chain per slow_chunk k
    from +0, their values added in increasing k (slow), then added to +0 (semantics.md c.1, c.2). ``c`` (fp32
    [M, N], fast only): the chain's starting accumulator, as ``mmaemu.model.dot`` takes it. ``method``: the
    exponent pass (default: the one the kernel runs from sm_80 on)."""
    from mmaemu.arith.params import preset_params

    method = method or offset.exponent_method(fmt_a, fmt_b, preset.nfma)
    params = offset.offset_params(preset_params(preset, fmt_a, fmt_b), fmt_a, fmt_b, method)
    M, K = a.shape
    N = b.shape[0]
    A, B = packed_operand(a, fmt_a, K, method), packed_operand(b, fmt_b, K, method)
    shape = (A[0].shape[1], B[0].shape[1])  # the tile: whole vectors of four rows and columns
    c_val = np.zeros(shape, np.float32)
    if c is not None:
        c_val[:M, :N] = c
    partial = np.zeros(shape, np.float32)
    work = (np.zeros(shape, np.uint32), np.zeros(shape, np.float32), np.zeros(shape, np.uint32),
            np.zeros(shape, np.uint32))
    value = np.vectorize(lambda x: offset.offset_chain_value(np.float32(x), preset.frac_out), otypes=[np.float32])
    step = block_step(method)
    for kb in range(0, K, preset.nfma):
        if not fast and kb and kb % preset.slow_chunk == 0:
            partial, c_val = (partial + value(c_val)).astype(np.float32), np.zeros(shape, np.float32)
        step(*A, 0, *B, 0, kb, min(kb + preset.nfma, K), params, c_val, work)
    return (np.float32(0.0) + (partial + value(c_val))).astype(np.float32)[:M, :N]


def assert_same(a, b, fmt_a, fmt_b, preset, fast, method=None):
    want = accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, reference=True)
    got = offset_accumulate(a, b, fmt_a, fmt_b, preset, fast, method=method)
    finite = np.isfinite(want)  # NaN/Inf outputs come from the override kernel, not from the block step
    bad = np.argwhere((want.view(np.uint32) != got.view(np.uint32)) & finite)
    if len(bad):
        m, n = bad[0]
        raise AssertionError(f"{len(bad)} outputs differ ({preset.name}, {fmt_a}x{fmt_b}, {method}, fast={fast}, "
                             f"K={a.shape[1]}); first at ({m}, {n}): reference {want[m, n]!r} offset {got[m, n]!r}")


def _declined(preset):
    return offset.offset_decline(preset.nfma, preset.frac, preset.frac_out, int(preset.late_c))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS)
def test_offset_block_equals_reference(preset, fmt_a, fmt_b):
    assert _declined(preset) is None
    rng = np.random.default_rng(abs(hash((preset.name, fmt_a, fmt_b))) % 2**32)
    for method in methods(fmt_a, fmt_b, preset):
        for fast in (True, False):
            for M, N, K in ((3, 5, 1), (4, 7, 33), (5, 6, 300)):
                assert_same(random_codes(rng, fmt_a, (M, K)), random_codes(rng, fmt_b, (N, K)), fmt_a, fmt_b,
                            preset, fast, method)
                assert_same(spread_codes(rng, fmt_a, (M, K)), spread_codes(rng, fmt_b, (N, K)), fmt_a, fmt_b,
                            preset, fast, method)
                a, b = cancelling_codes(rng, fmt_a, fmt_b, M, N, K)
                assert_same(a, b, fmt_a, fmt_b, preset, fast, method)


def extreme_operands(fmt, preset):
    """Blocks of the largest products of one sign on a large accumulator (the top of the window), with subnormals
    and zeros among them (counted against the threshold's clamps), for both signs of A."""
    big, tiny = EXTREMES[fmt][0], EXTREMES[fmt][1]
    K = 4 * preset.nfma + 3
    out = []
    for sign in (0x00, 0x80):
        a = np.full((3, K), big | sign, np.uint8)
        a[2, ::3] = 0x80  # -0 next to negative products
        b = np.full((4, K), big, np.uint8)
        b[1, ::7] = tiny  # subnormals truncated away at the bottom of the grid
        b[2] = big - 1
        b[3, ::2] = tiny | 0x80
        out.append((a, b))
    return out


@pytest.mark.parametrize("preset", [EDGE, HOPPER, ADA], ids=lambda p: p.name)
def test_window_edge_with_maximal_same_sign_products(preset):
    for fmt in ("e4m3", "e5m2"):
        for a, b in extreme_operands(fmt, preset):
            for method in methods(fmt, fmt, preset):
                for fast in (True, False):
                    assert_same(a, b, fmt, fmt, preset, fast, method)


def truncated_onto_block_grid(x, e_floor, frac):
    """x truncated toward zero onto 2**(E - frac), E = max(exponent of x, e_floor): the block step with no product,
    from exact rationals."""
    from fractions import Fraction

    grid = Fraction(2) ** (max(int(np.floor(np.log2(abs(float(x))))) if x else -127, e_floor) - frac)
    q = Fraction(float(x)) / grid
    return (q.numerator // q.denominator if q >= 0 else -((-q.numerator) // q.denominator)) * grid


@pytest.mark.parametrize("preset", [HOPPER, ADA, FINE_OUT, HIGH_MIN_EXP], ids=lambda p: p.name)
def test_empty_block_truncates_the_accumulator_onto_its_grid(preset):
    """offset_empty_block (a block without products: zero padding of a split tile) = c truncated toward zero onto
    2**(E - frac), E = max(exponent of c, e_floor), from exact rationals; +0 stays +0."""
    from fractions import Fraction

    from mmaemu.arith.params import preset_params

    rng = np.random.default_rng(21)
    for fa, fb in PAIRS:
        params = offset.offset_params(preset_params(preset, fa, fb), fa, fb)
        e_floor = (params.floor_bits >> 23) - 127
        lo = offset.format_low_range(fa)[0] + offset.format_low_range(fb)[0]
        # accumulators of GEMM chains: +0 or multiples of 2**lo below 2**40, both signs
        c = np.array([0.0] + [float(np.float32(rng.integers(1, 2**24) * 2.0 ** rng.integers(lo, 17)) *
                                    rng.choice([-1, 1])) for _ in range(300)], np.float32).reshape(1, -1)
        got = c.copy()
        work = tuple(np.zeros(c.shape, t) for t in (np.uint32, np.float32, np.uint32, np.uint32))
        offset.offset_empty_block(params, got, work)
        for x, y in zip(c[0], got[0]):
            want = truncated_onto_block_grid(x, e_floor, preset.frac)
            assert Fraction(float(y)) == want, (preset.name, fa, fb, x, y)
            assert want != 0 or not np.signbit(y), (preset.name, fa, fb, x, y)  # a zero block sum is +0


def blocks_of_zero_codes_disagree(preset):
    """A block of zero codes through the whole block step, both exponent passes, on accumulators c from 2**lo to
    2**-5 that are not multiples of 2**lo (the Ada recordings' c): c truncated onto its own grid (the empty sums
    must not raise E). Returns the number of wrong outputs."""
    from fractions import Fraction

    rng = np.random.default_rng(22)
    lo = 2 * offset.format_low_range("e4m3")[0]
    c = np.array([float(np.float32(rng.integers(2**23, 2**24) * 2.0 ** (rng.integers(lo, -4) - 23)) *
                        rng.choice([-1, 1])) for _ in range(40)], np.float32).reshape(1, -1)
    zeros = np.zeros((1, preset.nfma), np.uint8), np.zeros((c.shape[1], preset.nfma), np.uint8)
    bad = 0
    for method in methods("e4m3", "e4m3", preset):
        got = offset_accumulate(*zeros, "e4m3", "e4m3", preset, True, c=c, method=method)
        bad += sum(Fraction(float(y)) != truncated_onto_block_grid(x, lo, preset.frac) for x, y in zip(c[0], got[0]))
    return bad


@pytest.mark.parametrize("preset", [HOPPER, ADA], ids=lambda p: p.name)
def test_blocks_of_zero_codes_keep_the_accumulators_grid(preset):
    assert blocks_of_zero_codes_disagree(preset) == 0


def test_power_start_mutation_is_caught_by_blocks_of_zero_codes(monkeypatch):
    """A +0 start reads an empty power sum as E = -14 (condition 12): the accumulator is truncated too far."""
    monkeypatch.setattr(offset, "POWER_START", 0)
    assert blocks_of_zero_codes_disagree(HOPPER) > 0


def test_decline_rules():
    assert "2**22 units" in _declined(OVER)
    assert "early-accumulator" in offset.offset_decline(32, 25, 23, 1)
    assert "frac_out >= frac" in offset.offset_decline(16, 13, 12, 0)
    assert "16 k at a time" in offset.offset_decline(8, 13, 13, 0)
    assert "16 k at a time" in offset.offset_decline(24, 13, 13, 0)
    assert _declined(HOPPER) is None and _declined(ADA) is None


def test_both_offset_engines_decline_a_min_exp_whose_offset_overflows():
    """Condition 2's top (offset_floor_decline): one rule for the CPU engine and the CUDA kernel."""
    from mmaemu.arith.params import Schedule, preset_params
    from mmaemu.cpu.features import offset_call_decline
    from mmaemu.cuda.offset.kernel import offset_decline as cuda_offset_decline

    high = Preset("offset-minexp-high", nfma=32, frac=13, frac_out=13, min_exp=118, late_c=False, slow_chunk=128)
    edge = Preset("offset-minexp-edge", nfma=32, frac=13, frac_out=13, min_exp=117, late_c=False, slow_chunk=128)
    unsplit = Schedule(1, 1, 0, 0, 0, 0)
    for preset, declined in ((high, True), (edge, False)):
        params = preset_params(preset, "e4m3", "e4m3")
        for why in (offset.offset_preset_decline(params), offset_call_decline(preset, unsplit, "e4m3", "e4m3"),
                    cuda_offset_decline(unsplit, params)):
            assert (why is not None and "overflows fp32" in why) == declined, (preset.name, why)


# ----------------------------------------------------------------------------------------------------------------
# Mutations: each bound of the docstring, broken on purpose, must make the comparison fail


def absent_block_operands(fmt_a, fmt_b):
    """Rows of small products, then a block of zero codes, then more small products: the zero block's exponent
    comes from the accumulator alone (a wrong reading of absent terms raises E and truncates it)."""
    K = 3 * HOPPER.nfma
    a = np.full((2, K), EXTREMES[fmt_a][2] | 0x01, np.uint8)  # the smallest normal exponent, odd significand
    b = np.full((3, K), 0x03, np.uint8)  # a subnormal of two bits: sums with bits far below 2**-13
    a[:, HOPPER.nfma:2 * HOPPER.nfma] = 0
    b[1, ::2] |= 0x80
    b[2, HOPPER.nfma:2 * HOPPER.nfma] = 0x80
    return a, b


def _mutated_cases():
    rng = np.random.default_rng(99)
    cases = [(*absent_block_operands(fa, fb), fa, fb) for fa, fb in PAIRS]
    for fa, fb in PAIRS:
        a, b = spread_codes(rng, fa, (6, 200)), spread_codes(rng, fb, (7, 200))
        a[:, ::5] = 0  # zero terms next to negative products
        b[:, 3::11] = 0x80
        cases.append((a, b, fa, fb))
        for x, y in extreme_operands(fb, HOPPER):
            cases.append((x, y, fb, fb))
    return cases


def _fails(monkeypatch, module, name, value, method=offset.ADD_MAX):
    monkeypatch.setattr(module, name, value)
    for a, b, fa, fb in _mutated_cases():
        if method not in methods(fa, fb, HOPPER):
            continue
        for preset in (HOPPER, ADA):
            for fast in (True, False):
                try:
                    assert_same(a, b, fa, fb, preset, fast, method)
                except AssertionError:
                    return True
    return False


def count_flags_disagree(method=offset.ADD_MAX, frac=13):
    """Every pair of codes of every format pair the exponent pass serves, in every byte of a word next to a
    zero-zero pair, for every block exponent from below the lower clamp (add-max; from the floor, where the shift is
    negative, for the power sums, which have no lower clamp) to above the upper one: the counted bit (module
    docstring) against "the product is negative and not a multiple of u", from exact integers. Returns the number
    of disagreements."""
    from mmaemu import formats

    bad = 0
    for fa, fb in PAIRS if method == offset.ADD_MAX else [power_sums.POWER_FORMATS]:
        ta, tb = offset.offset_tables(fa, method), offset.offset_tables(fb, method)
        la_a, ra = offset.format_low_range(fa)
        la_b, rb = offset.format_low_range(fb)
        va, vb = np.array(formats.values(fa)), np.array(formats.values(fb))
        codes = np.arange(256)
        # lowest-set-bit exponents of the values (exact): low byte + la_min for finite nonzero codes
        fin_a, fin_b = np.isfinite(va) & (va != 0), np.isfinite(vb) & (vb != 0)
        lo_a = np.where(fin_a, ta[2].astype(np.int64) + la_a, 10**6)
        lo_b = np.where(fin_b, tb[2].astype(np.int64) + la_b, 10**6)
        neg = (np.sign(va)[:, None] * np.sign(vb)[None, :]) < 0
        params = offset.offset_params((16, 0, 0, frac, frac, -132, 0), fa, fb, method)
        floor_bits, tau_add, tau_max, top4 = params.floor_bits, params.tau_add, params.tau_max, params.top4
        e_floor = (floor_bits >> 23) - 127
        clamp_low = method == offset.ADD_MAX
        for e in range(e_floor - 3 * clamp_low, frac + la_a + la_b + tau_max + 4):  # both clamps and beyond
            shift = min(max(e + 127 + tau_add, 0) if clamp_low else e + 127 + tau_add, tau_max)  # offset_start's
            t4 = np.uint32((top4 - shift * 0x01010101) % 2**32)
            inexact = (lo_a[:, None] + lo_b[None, :]) < e - frac
            want = neg & inexact & fin_a[:, None] & fin_b[None, :]
            for shift in (0, 8, 16, 24):
                low = (ta[2][codes][:, None] << shift) + (tb[2][codes][None, :] << shift)
                sgn = (ta[3][codes][:, None] << shift) ^ (tb[3][codes][None, :] << shift)
                if shift:  # a zero-zero pair in the byte below: a carry out of it would show
                    below = shift - 8
                    low = low + ((ta[2][0] + tb[2][0]) << below)
                word = (low.astype(np.uint64) + np.uint64(t4)) % 2**32
                flags = (~word.astype(np.uint32)) & sgn.astype(np.uint32)
                got = ((flags >> shift) & 0x80) != 0
                bad += int(np.count_nonzero(got != want))
    return bad


def test_count_flags_exhaustively():
    assert count_flags_disagree() == 0
    # The power sums' tables without a lower clamp, up to frac = 15 (the largest a block of 16 admits, condition 1).
    assert count_flags_disagree(offset.POWER_SUMS, 13) == 0
    assert count_flags_disagree(offset.POWER_SUMS, 15) == 0


@pytest.mark.parametrize("value", [offset.ZERO_LOW - 1, offset.ZERO_LOW + 3])
def test_zero_byte_bounds(monkeypatch, value):
    """ZERO_LOW = 63 is the lowest value that works and the highest that never carries: 62 reads a zero term
    inexact at the top clamp (E5M2 x E5M2, R + 1 = 63); from 65 up, two zero terms and a threshold byte near 128
    carry into the next k's byte and flip its test (64 carries only where no test can flip)."""
    monkeypatch.setattr(offset, "ZERO_LOW", value)
    assert count_flags_disagree() > 0


@pytest.mark.parametrize("value,works", [(34, False), (35, True), (56, True), (64, True), (65, False)])
def test_power_zero_byte_bounds(monkeypatch, value, works):
    """Condition 14: the power sums' zero byte works from R + 1 = 35 (34 reads a zero term inexact at the upper
    clamp); up to 56 no byte sum reaches 256 even under the largest threshold without a lower clamp (128 + 15);
    from 57 two zero terms carry there, but into bytes whose bit 7 is set anyway; from 65, as for ZERO_LOW, two
    zero terms under a threshold near 128 carry into the next k's byte and flip its test."""
    monkeypatch.setattr(offset, "POWER_ZERO_LOW", value)
    assert (count_flags_disagree(offset.POWER_SUMS, 15) == 0) == works


@pytest.mark.parametrize("name,value", [
    ("THRESHOLD_TOP", 127),  # the exactness bit one unit off
    ("THRESHOLD_TOP", 129),
    ("SIGN_BYTE", 0x40),  # the sign in the wrong bit: nothing is ever corrected
    ("OFFSET_MANTISSA", 0),  # M at the bottom of its binade: negative sums leave it
    ("EXP_ABSENT", offset.EXP_BIAS),  # an absent term reads as exponent 0: it sets E above small products
    ("EXP_ABSENT", offset.EXP_BIAS - 256),  # two absent halves read as E = 0 (condition 9)
])
def test_mutations_are_caught(monkeypatch, name, value):
    assert _fails(monkeypatch, offset, name, value), f"{name} = {value} went unnoticed"


def test_unmutated_constants_pass_the_same_cases():
    for a, b, fa, fb in _mutated_cases()[:3]:
        assert_same(a, b, fa, fb, HOPPER, True)


# ----------------------------------------------------------------------------------------------------------------
# Against the independent oracle, the contract's vectors and hardware recordings


def test_offset_block_equals_oracle():
    """The random and adversarial cases of test_engine_vs_oracle (unsplit; splits are the kernel's walk, checked
    in the simulator) against tests/oracle.py, for every preset the formulation accepts."""
    checked = 0
    for seed in range(400):
        a, b, fa, fb, preset, fast, S, scheme = accumulate_case(seed)
        if preset.late_c or _declined(preset) is not None:
            continue
        want = np.array(oracle.accumulate(a.tolist(), b.tolist(), fa, fb, preset, fast), np.uint32)
        got = offset_accumulate(a, b, fa, fb, preset, fast).view(np.uint32)
        finite = np.isfinite(want.view(np.float32))
        bad = np.argwhere((want != got) & finite)
        assert not len(bad), f"seed {seed}: {preset.name} {fa}x{fb} fast={fast} K={a.shape[1]} at {bad[0]}"
        checked += int(finite.sum())
    assert checked > 500


@pytest.mark.parametrize("v", [v for v in spec_vectors() if v["api"] == "accumulate" and v["S"] == 1],
                         ids=lambda v: v["id"])
def test_offset_block_reproduces_the_contract_vectors(v):
    from mmaemu.model.presets import get_preset
    from mmaemu.platform.profiles import get_profile

    preset = get_preset(get_profile(v["profile"]).preset, warn=False)
    if preset.late_c or _declined(preset) is not None or not np.isfinite(np.uint32(v["result"]).view(np.float32)):
        pytest.skip(f"{v['id']}: {preset.name} / non-finite result (not the offset formulation's)")
    a = np.array([v["a"]], np.uint8)
    b = np.array([v["b"]], np.uint8)
    got = int(offset_accumulate(a, b, v["fmt_a"], v["fmt_b"], preset, v["fast"]).view(np.uint32)[0, 0])
    assert got == v["result"], f"{v['id']}: {got:#010x} != {v['result']:#010x}"


@pytest.mark.parametrize("gpu,fmt,preset,uses_c", [("H100", "E4M3", HOPPER, False), ("H100", "E5M2", HOPPER, False),
                                                   ("Ada", "E4M3", ADA, True), ("Ada", "E5M2", ADA, True)],
                         ids=str)
def test_offset_block_reproduces_hardware_vectors(gpu, fmt, preset, uses_c):
    """Khattak-Mikaitis recordings of single K = 32 FP8 instructions (H100 wgmma with c = 0; Ada mma.sync with its
    c). The formulation is claimed for accumulators of GEMM chains, which are 0 or at least 2**lo (condition 2:
    E is raised to lo), so Ada cases whose c is tiny, or whose result is not finite, are left to test_vectors.py."""
    a, b, c, d = km_cases(gpu, fmt)
    f = fmt.lower()
    c32 = np.asarray(c, np.uint32).view(np.float32) if uses_c else np.zeros(len(d), np.float32)
    d32 = np.asarray(d, np.uint32).view(np.float32)
    lo = 2 * offset.format_low_range(f)[0]
    keep = np.isfinite(c32) & ((c32 == 0) | (np.abs(c32) >= np.float32(2.0) ** lo)) & np.isfinite(d32)
    assert keep.sum() > 4000
    for i in np.flatnonzero(keep)[:800]:  # a sample keeps CI short; test_vectors.py runs them all
        got = offset_accumulate(a[i:i + 1], b[i:i + 1], f, f, preset, True, c=c32[i:i + 1].reshape(1, 1))
        assert got.view(np.uint32)[0, 0] == np.uint32(d[i]), (gpu, fmt, int(i))

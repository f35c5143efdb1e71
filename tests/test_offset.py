"""The offset formulation (mmaemu.arith.offset, the arithmetic of the cuda:offset kernel) equals the reference path
(accumulate_one) bit for bit, and its packed primitives (mmaemu.arith.packed) are the integer functions they claim.

The primitives' twins are checked against Python integers; the fp16 stand-in for max.u16x2 below sm_90 on both
sides of its domain. The block step is checked against the reference on every format pair, hopper, ada and
custom presets at the edges of its conditions (the 2**22 window, min_exp above the products), on random, wide
spread, exactly cancelling and maximal same-sign inputs, fast and slow, ragged K; against the independent oracle,
the contract's accumulate vectors and the Khattak-Mikaitis hardware recordings. Each exactness condition of
mmaemu/arith/offset.py is tested on both sides of its bound: a mutation of the threshold byte, the zero byte, the
absent exponent or the offset makes the reference comparison fail (test_mutations_are_caught).
"""

import numpy as np
import pytest

from mmaemu.arith import offset, packed
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
        p_shift, floor_bits = params[2], params[3]
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


# ----------------------------------------------------------------------------------------------------------------
# The block step against the reference


def packed_operand(codes, fmt, K):
    """Staged (val, exp, byte words) arrays of the codes, k-major, K padded to whole passes (offset_pack_rows)."""
    Kp = max(offset.K_PASS, -(-K // offset.K_PASS) * offset.K_PASS)
    rows = codes.shape[0]
    arrays = (np.zeros((Kp, rows), np.float32), np.zeros((Kp // 2, rows), np.uint32),
              np.zeros((Kp // 4, 2 * rows), np.uint32))
    offset.offset_pack_rows(codes, tuple(offset.offset_tables(fmt)), *arrays)
    return arrays


def offset_accumulate(a, b, fmt_a, fmt_b, preset, fast, c=None):
    """Accumulators [M, N] of the finite path by offset_block: one chain over K (fast) or a chain per slow_chunk k
    from +0, their values added in increasing k (slow), then added to +0 (semantics.md c.1, c.2). ``c`` (fp32
    [M, N], fast only): the chain's starting accumulator, as ``mmaemu.model.dot`` takes it."""
    from mmaemu.arith.params import preset_params

    params = offset.offset_params(preset_params(preset, fmt_a, fmt_b), fmt_a, fmt_b)
    M, K = a.shape
    N = b.shape[0]
    A, B = packed_operand(a, fmt_a, K), packed_operand(b, fmt_b, K)
    c_val = np.zeros((M, N), np.float32) if c is None else np.array(c, np.float32)
    partial = np.zeros((M, N), np.float32)
    work = (np.zeros((M, N), np.uint32), np.zeros((M, N), np.float32), np.zeros((M, N), np.uint32),
            np.zeros((M, N), np.uint32))
    value = np.vectorize(lambda x: offset.offset_chain_value(np.float32(x), preset.frac_out), otypes=[np.float32])
    for kb in range(0, K, preset.nfma):
        if not fast and kb and kb % preset.slow_chunk == 0:
            partial, c_val = (partial + value(c_val)).astype(np.float32), np.zeros((M, N), np.float32)
        offset.offset_block(*A, 0, *B, 0, kb, min(kb + preset.nfma, K), params, c_val, work)
    return (np.float32(0.0) + (partial + value(c_val))).astype(np.float32)


def assert_same(a, b, fmt_a, fmt_b, preset, fast):
    want = accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, reference=True)
    got = offset_accumulate(a, b, fmt_a, fmt_b, preset, fast)
    finite = np.isfinite(want)  # NaN/Inf outputs come from the override kernel, not from the block step
    bad = np.argwhere((want.view(np.uint32) != got.view(np.uint32)) & finite)
    if len(bad):
        m, n = bad[0]
        raise AssertionError(f"{len(bad)} outputs differ ({preset.name}, {fmt_a}x{fmt_b}, fast={fast}, "
                             f"K={a.shape[1]}); first at ({m}, {n}): reference {want[m, n]!r} offset {got[m, n]!r}")


def _declined(preset):
    return offset.offset_decline(preset.nfma, preset.frac, preset.frac_out, int(preset.late_c))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS)
def test_offset_block_equals_reference(preset, fmt_a, fmt_b):
    assert _declined(preset) is None
    rng = np.random.default_rng(abs(hash((preset.name, fmt_a, fmt_b))) % 2**32)
    for fast in (True, False):
        for M, N, K in ((3, 5, 1), (4, 7, 33), (5, 6, 300)):
            assert_same(random_codes(rng, fmt_a, (M, K)), random_codes(rng, fmt_b, (N, K)), fmt_a, fmt_b, preset,
                        fast)
            assert_same(spread_codes(rng, fmt_a, (M, K)), spread_codes(rng, fmt_b, (N, K)), fmt_a, fmt_b, preset,
                        fast)
            a, b = cancelling_codes(rng, fmt_a, fmt_b, M, N, K)
            assert_same(a, b, fmt_a, fmt_b, preset, fast)


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
            for fast in (True, False):
                assert_same(a, b, fmt, fmt, preset, fast)


@pytest.mark.parametrize("preset", [HOPPER, ADA, FINE_OUT, HIGH_MIN_EXP], ids=lambda p: p.name)
def test_empty_block_truncates_the_accumulator_onto_its_grid(preset):
    """offset_empty_block (a block without products: zero padding of a split tile) = c truncated toward zero onto
    2**(E - frac), E = max(exponent of c, e_floor), from exact rationals; +0 stays +0."""
    from fractions import Fraction

    from mmaemu.arith.params import preset_params

    rng = np.random.default_rng(21)
    for fa, fb in PAIRS:
        params = offset.offset_params(preset_params(preset, fa, fb), fa, fb)
        e_floor = (params[3] >> 23) - 127
        lo = offset.format_low_range(fa)[0] + offset.format_low_range(fb)[0]
        # accumulators of GEMM chains: +0 or multiples of 2**lo below 2**40, both signs
        c = np.array([0.0] + [float(np.float32(rng.integers(1, 2**24) * 2.0 ** rng.integers(lo, 17)) *
                                    rng.choice([-1, 1])) for _ in range(300)], np.float32).reshape(1, -1)
        got = c.copy()
        work = tuple(np.zeros(c.shape, t) for t in (np.uint32, np.float32, np.uint32, np.uint32))
        offset.offset_empty_block(params, got, work)
        for x, y in zip(c[0], got[0]):
            grid = Fraction(2) ** (max(int(np.floor(np.log2(abs(float(x))))) if x else -127, e_floor) - preset.frac)
            q = Fraction(float(x)) / grid
            want = (q.numerator // q.denominator if q >= 0 else -((-q.numerator) // q.denominator)) * grid
            assert Fraction(float(y)) == want, (preset.name, fa, fb, x, y)
            assert want != 0 or not np.signbit(y), (preset.name, fa, fb, x, y)  # a zero block sum is +0


def test_decline_rules():
    assert "2**22 units" in _declined(OVER)
    assert "early-accumulator" in offset.offset_decline(32, 25, 23, 1)
    assert "frac_out >= frac" in offset.offset_decline(16, 13, 12, 0)
    assert "16 k at a time" in offset.offset_decline(8, 13, 13, 0)
    assert "16 k at a time" in offset.offset_decline(24, 13, 13, 0)
    assert _declined(HOPPER) is None and _declined(ADA) is None


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


def _fails(monkeypatch, module, name, value):
    monkeypatch.setattr(module, name, value)
    for a, b, fa, fb in _mutated_cases():
        for preset in (HOPPER, ADA):
            for fast in (True, False):
                try:
                    assert_same(a, b, fa, fb, preset, fast)
                except AssertionError:
                    return True
    return False


def count_flags_disagree():
    """Every pair of codes of every format pair, in every byte of a word next to a zero-zero pair, for every block
    exponent from below the lower clamp to above the upper one: the counted bit (module docstring) against "the
    product is negative and not a multiple of u", from exact integers. Returns the number of disagreements."""
    from fractions import Fraction

    from mmaemu import formats

    bad = 0
    for fa, fb in PAIRS:
        ta, tb = offset.offset_tables(fa), offset.offset_tables(fb)
        la_a, ra = offset.format_low_range(fa)
        la_b, rb = offset.format_low_range(fb)
        va, vb = np.array(formats.values(fa)), np.array(formats.values(fb))
        codes = np.arange(256)
        # lowest-set-bit exponents of the values (exact): low byte + la_min for finite nonzero codes
        fin_a, fin_b = np.isfinite(va) & (va != 0), np.isfinite(vb) & (vb != 0)
        lo_a = np.where(fin_a, ta[2].astype(np.int64) + la_a, 10**6)
        lo_b = np.where(fin_b, tb[2].astype(np.int64) + la_b, 10**6)
        neg = (np.sign(va)[:, None] * np.sign(vb)[None, :]) < 0
        nfma, frac_out, p_shift, floor_bits, m_add, tau_add, tau_max, top4, _ = offset.offset_params(
            (32, 0, 0, 13, 13, -132, 0), fa, fb)
        e_floor = (floor_bits >> 23) - 127
        for e in range(e_floor - 3, 13 + la_a + la_b + tau_max + 4):  # both clamps and beyond
            shift = min(max(e + 127 + tau_add, 0), tau_max)  # as offset_block_start computes it
            t4 = np.uint32((top4 - shift * 0x01010101) % 2**32)
            inexact = (lo_a[:, None] + lo_b[None, :]) < e - 13
            want = neg & inexact & fin_a[:, None] & fin_b[None, :]
            for shift in (0, 8, 16, 24):
                low = (ta[2][codes][:, None] << shift) + (tb[2][codes][None, :] << shift)
                sgn = (ta[3][codes][:, None] << shift) ^ (tb[3][codes][None, :] << shift)
                if shift:  # a zero-zero pair in the byte below: a carry out of it would show
                    below = shift - 8
                    low = low + (np.uint32(offset.ZERO_LOW) << below) * 2
                word = (low.astype(np.uint64) + np.uint64(t4)) % 2**32
                flags = (~word.astype(np.uint32)) & sgn.astype(np.uint32)
                got = ((flags >> shift) & 0x80) != 0
                bad += int(np.count_nonzero(got != want))
    return bad


def test_count_flags_exhaustively():
    assert count_flags_disagree() == 0


@pytest.mark.parametrize("value", [offset.ZERO_LOW - 1, offset.ZERO_LOW + 3])
def test_zero_byte_bounds(monkeypatch, value):
    """ZERO_LOW = 63 is the lowest value that works and the highest that never carries: 62 reads a zero term
    inexact at the top clamp (E5M2 x E5M2, R + 1 = 63); from 65 up, two zero terms and a threshold byte near 128
    carry into the next k's byte and flip its test (64 carries only where no test can flip)."""
    monkeypatch.setattr(offset, "ZERO_LOW", value)
    assert count_flags_disagree() > 0


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

"""The fast CPU path (mmaemu.arith.tile via mmaemu.cpu.gemm.accumulate_gemm) equals the reference path
(mmaemu.arith.schedule.accumulate_one via accumulate_gemm_reference) bit for bit.

The inputs are built to defeat each step where the fast formulation differs from the reference (see the
docstring of mmaemu/arith/tile.py): products aligned by an fp32 power-of-two multiplier instead of integer shifts
(wide exponent spreads, shift counts past the lane width, subnormals), the clamp of that multiplier (presets whose
min_exp puts E far above every product), int32 lanes (presets just below and above the int32 bound, with
maximal same-sign products), the absent-exponent sentinel (blocks of zeros, +-0 codes, all-zero rows), the
branch-free normalisation (exact cancellations, +0 results, carries), tiles of 1-4 rows and 16-128 lanes with
padding, ragged K, every format pair, every split scheme with S up to 24 (splits that own no tile, padding
tiles), slow accumulation, NaN/Inf codes, the shipped presets and custom ones.
"""

import itertools

import numpy as np
import pytest

from mmaemu.arith import intbits
from mmaemu.arith.params import preset_params, schedule_params
from mmaemu import formats
from mmaemu.arith.tile import (TILE_ABSENT_EXP, TILE_FORMATS, lane_bit_length, lane_bits_needed, lane_cap,
                               lane_shift_toward_zero, pow2_float32, pow2_scale, tile_decode)
from mmaemu.cpu import engine
from mmaemu.cpu.engine import accumulate_codes
from mmaemu.errors import UnsupportedFeatureError
from mmaemu.model.presets import ADA, B200_MMA_SYNC, HOPPER, Preset

PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]
NONFINITE = {"e4m3": [0x7F, 0xFF], "e5m2": [0x7C, 0xFC, 0x7D, 0xFE, 0x7F]}
# Largest finite magnitude, smallest subnormal, smallest normal (positive codes) per format.
EXTREMES = {"e4m3": (0x7E, 0x01, 0x08), "e5m2": (0x7B, 0x01, 0x04)}

CUSTOM = Preset("fast-8x20", nfma=8, frac=20, frac_out=20, min_exp=-132, late_c=False, slow_chunk=128)
CUSTOM_COARSE = Preset("fast-64x3", nfma=64, frac=3, frac_out=5, min_exp=-132, late_c=False, slow_chunk=128)
# Both sides of the int32 lane bound nfma * 2**(frac+2) + 2**(frac+1) < 2**31.
LANES32_EDGE = Preset("fast-32x23", nfma=32, frac=23, frac_out=23, min_exp=-132, late_c=False, slow_chunk=128)
LANES64_EDGE = Preset("fast-32x24", nfma=32, frac=24, frac_out=23, min_exp=-132, late_c=False, slow_chunk=128)
# Needs int64 lanes for real (64 maximal products sum past 2**31 on the grid of frac 24).
OVER32 = Preset("fast-64x24", nfma=64, frac=24, frac_out=23, min_exp=-132, late_c=False, slow_chunk=128)
WIDE = Preset("fast-16x40", nfma=16, frac=40, frac_out=23, min_exp=-132, late_c=False, slow_chunk=128)
LATE_CUSTOM = Preset("fast-late-4x9", nfma=4, frac=9, frac_out=7, min_exp=-133, late_c=True, slow_chunk=128)
# min_exp on both sides of every product exponent and of the multiplier clamp (frac + 126 = 139).
MIN_EXP = [Preset(f"fast-minexp{e}", nfma=16, frac=13, frac_out=13, min_exp=e, late_c=False, slow_chunk=128)
           for e in (-1000, -20, 0, 20, 139, 140, 1000)]
SCHEMES = {HOPPER: ("contiguous",), ADA: ("serial", "pairwise"), B200_MMA_SYNC: ()}


def _schemes(preset):
    return SCHEMES.get(preset, ("contiguous", "serial", "pairwise"))


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def assert_same(a, b, fmt_a, fmt_b, preset, fast, splits=1, scheme="none"):
    ref = accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, splits, scheme, reference=True)
    got = accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, splits, scheme)
    bad = np.argwhere(_bits(ref) != _bits(got))
    if len(bad):
        m, n = bad[0]
        raise AssertionError(
            f"{len(bad)} outputs differ ({preset.name}, {fmt_a}x{fmt_b}, fast={fast}, S={splits} {scheme}, "
            f"K={a.shape[1]}); first at ({m}, {n}): reference {_bits(ref)[m, n]:08x} fast {_bits(got)[m, n]:08x}")


def _finite(fmt):
    bad = set(NONFINITE[fmt]) if fmt == "e4m3" else {c | s for c in range(0x7C, 0x80) for s in (0, 0x80)}
    return np.array([c for c in range(256) if c not in bad], np.uint8)


def random_codes(rng, fmt, shape, zeros=0.3):
    codes = rng.choice(_finite(fmt), size=shape).astype(np.uint8)
    codes[rng.random(shape) < zeros] = rng.choice([0x00, 0x80])
    return codes


def spread_codes(rng, fmt, shape):
    """Wide exponent spreads inside every block: the largest magnitudes, subnormals and everything between."""
    big, tiny, normal = EXTREMES[fmt]
    pool = np.array([big, big - 1, tiny, tiny + 1, normal, 0x00, 0x80, big >> 1, (big >> 1) + 3], np.uint8)
    codes = rng.choice(pool, size=shape).astype(np.uint8)
    return codes | (rng.integers(0, 2, shape, dtype=np.uint8) << 7)


def cancelling_codes(rng, fmt_a, fmt_b, M, N, K):
    """Rows of A whose products with B cancel exactly in pairs (x, -x) inside a block, plus tiny leftovers, so
    block sums are exactly 0 (+0 rule), tiny after a carry-free cancellation, or kept by a large accumulator."""
    a = random_codes(rng, fmt_a, (M, K), zeros=0.1)
    b = random_codes(rng, fmt_b, (N, K), zeros=0.1)
    for k in range(0, K - 1, 2):
        a[:, k + 1] = a[:, k] ^ 0x80
        b[:, k + 1] = b[:, k]
    leftover = rng.random((M, K)) < 0.05
    a[leftover] = EXTREMES[fmt_a][1] | (rng.integers(0, 2, leftover.sum(), dtype=np.uint8) << 7)
    return a, b


# The operand families of the random tests, by number: random codes, wide spreads, exact cancellations.
CODE_FAMILIES = (
    lambda rng, fmt_a, fmt_b, M, N, K: (random_codes(rng, fmt_a, (M, K)), random_codes(rng, fmt_b, (N, K))),
    lambda rng, fmt_a, fmt_b, M, N, K: (spread_codes(rng, fmt_a, (M, K)), spread_codes(rng, fmt_b, (N, K))),
    cancelling_codes,
)


def family_codes(rng, family, fmt_a, fmt_b, M, N, K):
    """Operands A [M, K] (fmt_a) and B [N, K] (fmt_b) of the operand family number ``family`` (CODE_FAMILIES)."""
    return CODE_FAMILIES[family](rng, fmt_a, fmt_b, M, N, K)


def _shapes(rng):
    """(M, N, K): 1-9 rows (tiles of 1, 2 and 4 rows with a remainder), 1-130 columns (16-128 lanes, padded
    panels) and a K that is rarely a multiple of 16, 32, 64 or 128."""
    M = int(rng.integers(1, 10))
    N = int(rng.choice([1, 5, 16, 17, 33, 64, 65, 130]))
    K = int(rng.choice([1, 7, 15, 17, 31, 33, 63, 65, 127, 129, 200, 257, 385, 600]))
    return M, N, K


# ----------------------------------------------------------------------------------------------------------------
# Building blocks of the tile arithmetic against the reference helpers
# ----------------------------------------------------------------------------------------------------------------

def test_pow2_float32_exact():
    for n in range(-200, 200):
        expected = np.float32(2.0 ** min(max(n, -126), 127))
        assert pow2_float32(np.int32(n)) == expected, n


def test_pow2_scale_exact_and_clamped():
    for n in range(-80, 140):
        assert pow2_scale(np.int32(n)) == np.float32(2.0 ** min(max(n, -33), 91)), n


@pytest.mark.parametrize("T", [np.int32, np.int64])
def test_lane_shift_and_bit_length_match_intbits(T):
    rng = np.random.default_rng(7)
    cap = lane_cap(T)
    assert cap == (31 if T is np.int32 else 63)
    top = 2**30 if T is np.int32 else 2**61
    values = np.concatenate([rng.integers(-top, top, 300), [0, 1, -1, 2, -2, top - 1, -(top - 1)],
                             [2**k for k in range(31 if T is np.int32 else 62)]])
    for x in values:
        x = int(x)
        assert lane_bit_length(T(abs(x)), T, cap) == intbits.bit_length(abs(x))
        for shift in (-70, -63, -32, -31, -30, -17, -5, -1, 0):
            assert lane_shift_toward_zero(T(x), np.int32(shift), T, cap) == intbits.shift_toward_zero(x, shift)
        for shift in (1, 3):  # exact left shifts within the lane
            if abs(x) < top // 8:
                assert lane_shift_toward_zero(T(x), np.int32(shift), T, cap) == x << shift


def test_lane_width_choice_covers_both_sides():
    assert lane_bits_needed(HOPPER) == lane_bits_needed(ADA) == 32
    assert lane_bits_needed(LANES32_EDGE) == 32 and lane_bits_needed(LANES64_EDGE) == 64
    assert lane_bits_needed(B200_MMA_SYNC) == lane_bits_needed(WIDE) == lane_bits_needed(OVER32) == 64


def test_int64_lanes_are_needed(monkeypatch):
    """The other side of the int32 bound is real: forcing int32 lanes on OVER32 overflows and changes bits."""
    a = np.full((2, 128), EXTREMES["e4m3"][0] - 8, np.uint8)  # 15 * 2**(e-10): the largest significand
    b = np.full((16, 128), EXTREMES["e4m3"][0] - 8, np.uint8)
    assert_same(a, b, "e4m3", "e4m3", OVER32, True)
    ref = accumulate_codes(a, b, "e4m3", "e4m3", OVER32, True, reference=True)
    monkeypatch.setattr(engine, "lane_bits_needed", lambda preset: 32)
    assert not np.array_equal(_bits(ref), _bits(accumulate_codes(a, b, "e4m3", "e4m3", OVER32, True)))


def test_tile_decode_matches_formats():
    """tile_decode gives every code's exact value and alignment exponent; zero, NaN and Inf codes are absent."""
    for fmt in ("e4m3", "e5m2"):
        values, exps, nonfinite = formats.values(fmt), formats.exponents(fmt), formats.nonfinite_codes(fmt)
        for c in range(256):
            val, exp = tile_decode(np.uint8(c), TILE_FORMATS[fmt])
            if nonfinite[c] or values[c] == 0:
                assert (val, exp) == (0, TILE_ABSENT_EXP), (fmt, c)
            else:
                assert val == values[c] and exp == exps[c], (fmt, c)


def test_nonfinite_patterns():
    for fmt, (mask, pattern) in engine.NONFINITE_PATTERN.items():
        codes = np.arange(256, dtype=np.uint8)
        assert np.array_equal((codes & mask) == pattern, formats.nonfinite_codes(fmt))
        rows = np.zeros((3, 70), np.uint8)
        rows[1, 69] = NONFINITE[fmt][-1]
        assert engine.nonfinite_flags(rows, fmt).tolist() == [False, True, False]


def test_tile_shapes():
    assert engine.tile_shape(64, 5760, 1920) == (4, 128)
    assert engine.tile_shape(16, 16, 65536) == (4, 16)
    assert engine.tile_shape(1, 1, 5) == (1, 16)
    assert engine.tile_shape(9, 300, 1 << 20) == (4, 128)


# ----------------------------------------------------------------------------------------------------------------
# Whole accumulations: fast path == reference path
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", [HOPPER, ADA, B200_MMA_SYNC, CUSTOM], ids=lambda p: p.name)
@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS)
def test_random_all_schedules(preset, fmt_a, fmt_b):
    rng = np.random.default_rng(hash((preset.name, fmt_a, fmt_b)) % 2**32)
    cases = [(True, 1, "none")]
    if preset.has_gemm_level:
        cases.append((False, 1, "none"))
        for scheme in _schemes(preset):
            for S in (2, 3, 5, 8, 24):
                cases.append((bool(rng.integers(0, 2)), S, scheme))
    for fast, S, scheme in cases:
        M, N, K = _shapes(rng)
        a, b = family_codes(rng, rng.integers(0, len(CODE_FAMILIES)), fmt_a, fmt_b, M, N, K)
        assert_same(a, b, fmt_a, fmt_b, preset, fast, S, scheme)


@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS)
def test_adversarial_blocks(fmt_a, fmt_b):
    """Hand-built blocks: one huge product with many tiny ones (shift counts past 31), exact cancellation to +0,
    a carry out of the 14 bits, an accumulator that dominates later small blocks, subnormal-only blocks,
    +-0 and zero rows/columns, for hopper and ada, fast and slow, on K spanning several blocks and chunks."""
    big_a, tiny_a, norm_a = EXTREMES[fmt_a]
    big_b, tiny_b, norm_b = EXTREMES[fmt_b]
    K = 300
    rows = []
    r = np.zeros(K, np.uint8); r[0] = big_a; r[1:32] = tiny_a; rows.append(r)            # spread in one block
    r = np.zeros(K, np.uint8); r[0] = big_a; r[1] = big_a ^ 0x80; r[2] = tiny_a; rows.append(r)  # cancel
    r = np.full(K, norm_a, np.uint8); rows.append(r)                                     # carries
    r = np.zeros(K, np.uint8); r[0] = big_a; r[40:300:3] = tiny_a; rows.append(r)        # c dominates
    r = np.full(K, tiny_a, np.uint8); r[::2] |= 0x80; rows.append(r)                      # subnormals, signs
    r = np.zeros(K, np.uint8); r[::5] = 0x80; rows.append(r)                             # only +-0
    r = np.zeros(K, np.uint8); r[129] = big_a; r[130] = tiny_a; rows.append(r)           # late first product
    a = np.stack(rows)
    cols = []
    c = np.full(K, big_b, np.uint8); cols.append(c)
    c = np.full(K, tiny_b, np.uint8); c[1::2] |= 0x80; cols.append(c)
    c = np.zeros(K, np.uint8); cols.append(c)                                            # zero column
    c = np.full(K, norm_b, np.uint8); c[0] = big_b; cols.append(c)
    c = np.arange(K, dtype=np.uint8) % 0x70; cols.append(c)                               # all exponents
    b = np.stack(cols)
    for preset, fast in itertools.product((HOPPER, ADA), (True, False)):
        for k in (K, 33, 129):
            assert_same(np.ascontiguousarray(a[:, :k]), np.ascontiguousarray(b[:, :k]), fmt_a, fmt_b, preset, fast)
    assert_same(a, b, fmt_a, fmt_b, HOPPER, True, 3, "contiguous")
    assert_same(a, b, fmt_a, fmt_b, ADA, False, 5, "pairwise")
    assert_same(a, b, fmt_a, fmt_b, B200_MMA_SYNC, True)


@pytest.mark.parametrize("preset", [LANES32_EDGE, LANES64_EDGE, OVER32, WIDE, LATE_CUSTOM, CUSTOM_COARSE],
                         ids=lambda p: p.name)
def test_lane_width_edges_and_custom_grids(preset):
    """Maximal same-sign products push block sums to the int32 bound (frac 23) and past it (frac 24, 40);
    subnormal-only blocks give the largest multipliers 2**(frac - E) (2**68 for frac 40); frac below the
    product's fraction bits (frac 3, 9) and frac_out above frac (padded blocks re-truncate c)."""
    rng = np.random.default_rng(11)
    for fmt_a, fmt_b in PAIRS:
        K = 200
        a = np.full((3, K), EXTREMES[fmt_a][0], np.uint8)
        b = np.full((20, K), EXTREMES[fmt_b][0], np.uint8)
        a[1] = spread_codes(rng, fmt_a, K)
        a[2] = EXTREMES[fmt_a][1] + rng.integers(0, 3, K)  # subnormal-only blocks: E = -28 .. -12
        b[10:] = random_codes(rng, fmt_b, (10, K))
        b[11] = EXTREMES[fmt_b][1] | (rng.integers(0, 2, K, dtype=np.uint8) << 7)
        b[5, ::2] |= 0x80
        assert_same(a, b, fmt_a, fmt_b, preset, True)
        assert_same(a, b, fmt_a, fmt_b, preset, False)
        for scheme in ("contiguous", "serial", "pairwise"):
            if scheme != "contiguous" and 64 % preset.nfma:
                continue
            assert_same(a, b, fmt_a, fmt_b, preset, True, 3, scheme)


@pytest.mark.parametrize("preset", MIN_EXP, ids=lambda p: p.name)
def test_min_exp_clamp_both_sides(preset):
    """E = max(exponents, min_exp): min_exp below every exponent, inside the product range (truncates small
    products), at and past frac + 126 (where the fast path clamps its power-of-two multiplier)."""
    rng = np.random.default_rng(5)
    for fmt_a, fmt_b in PAIRS:
        M, N, K = 3, 17, 150
        a, b = spread_codes(rng, fmt_a, (M, K)), spread_codes(rng, fmt_b, (N, K))
        assert_same(a, b, fmt_a, fmt_b, preset, True)
        assert_same(a, b, fmt_a, fmt_b, preset, False, 2, "pairwise")


@pytest.mark.parametrize("scheme", ["contiguous", "serial", "pairwise"])
def test_splits_that_own_no_tile(scheme):
    """S up to 24 on short K: contiguous splits past the last tile (+0 partials), interleaved splits made of
    padding tiles only, ragged last tiles, fast and slow."""
    preset = HOPPER if scheme == "contiguous" else ADA
    rng = np.random.default_rng(3)
    for K in (1, 64, 100, 129, 384, 385, 700):
        for S in (2, 4, 7, 13, 24):
            a, b = random_codes(rng, "e4m3", (2, K)), random_codes(rng, "e5m2", (18, K))
            assert_same(a, b, "e4m3", "e5m2", preset, bool(S % 2), S, scheme)
            assert_same(a, b, "e4m3", "e5m2", CUSTOM, not S % 2, S, scheme)


@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS)
def test_nonfinite_codes(fmt_a, fmt_b):
    """NaN and Inf codes: their rows/columns follow c.4, every other output is computed as if they were 0."""
    rng = np.random.default_rng(9)
    M, N, K = 6, 40, 97
    a, b = random_codes(rng, fmt_a, (M, K)), random_codes(rng, fmt_b, (N, K))
    a[1, 5] = NONFINITE[fmt_a][0]
    a[3, 90] = NONFINITE[fmt_a][-1]
    b[7, 0] = NONFINITE[fmt_b][0]
    b[20, 50] = NONFINITE[fmt_b][-1]
    b[21, 3] = NONFINITE[fmt_b][1]
    for preset, fast, S, scheme in [(HOPPER, True, 1, "none"), (HOPPER, False, 3, "contiguous"),
                                    (ADA, True, 4, "pairwise"), (ADA, False, 1, "none"),
                                    (B200_MMA_SYNC, True, 1, "none")]:
        assert_same(a, b, fmt_a, fmt_b, preset, fast, S, scheme)


def test_threads_tasks_and_tile_rows_do_not_change_bits(monkeypatch):
    """The result does not depend on the tile shape (rows per tile, lanes per panel), on how the loops are cut
    into tasks (one row tile per task, panels shared by several tasks) or on the thread count."""
    from mmaemu.cpu import threads

    rng = np.random.default_rng(2)
    a, b = random_codes(rng, "e4m3", (9, 300)), random_codes(rng, "e4m3", (70, 300))
    ref = accumulate_codes(a, b, "e4m3", "e4m3", ADA, False, 3, "serial", reference=True)
    for task_work, n_threads in [(1 << 25, 2), (1, 2), (1, 1), (1, 3)]:
        monkeypatch.setattr(threads, "TASK_WORK", task_work)
        monkeypatch.setattr(threads, "MIN_TASK_WORK", min(task_work, threads.MIN_TASK_WORK))
        monkeypatch.setattr(threads, "num_threads", lambda n=n_threads: n)
        for shape in [(1, 16), (2, 32), (4, 64), (4, 128), (3, 16)]:
            monkeypatch.setattr(engine, "tile_shape", lambda M, N, K, shape=shape: shape)
            got = accumulate_codes(a, b, "e4m3", "e4m3", ADA, False, 3, "serial")
            assert np.array_equal(_bits(ref), _bits(got)), (shape, task_work, n_threads)
        assert np.array_equal(_bits(ref), _bits(accumulate_codes(a, b, "e4m3", "e4m3", ADA, False, 3, "serial",
                                                                 reference=True)))


def test_gemm_level_errors_unchanged():
    a = np.zeros((1, 64), np.uint8)
    with pytest.raises(UnsupportedFeatureError):
        accumulate_codes(a, a, "e4m3", "e4m3", B200_MMA_SYNC, False)
    assert accumulate_codes(a[:, :0], a[:, :0], "e4m3", "e4m3", HOPPER, True).view(np.uint32).tolist() == [[0]]
    assert schedule_params(HOPPER, 64, True) and preset_params(HOPPER, "e4m3", "e4m3")


# ----------------------------------------------------------------------------------------------------------------
# Few rows of A with a prepared B (bfloat16 panel values, mmaemu.cpu.gemm.FEW_ROWS) == reference path
# ----------------------------------------------------------------------------------------------------------------

def test_narrow_panel_values_exact_for_every_code():
    from numba import njit

    from mmaemu.arith.tile import narrow_panel_values, panel_value

    @njit
    def widen(bits, out):
        for i in range(bits.size):
            out[i] = panel_value(bits[i])

    for fmt in ("e4m3", "e5m2"):
        values = engine.tile_tables(fmt)[0]
        bits = narrow_panel_values(values)
        assert bits.dtype == np.uint16
        wide = np.empty(values.size, np.float32)
        widen(bits, wide)
        assert np.array_equal(wide.view(np.uint32), values.view(np.uint32)), fmt
    with pytest.raises(ValueError):
        narrow_panel_values(np.array([1.0 + 2.0**-10], np.float32))


@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS)
def test_few_rows_prepared_matches_reference(fmt_a, fmt_b):
    """M = 1 .. FEW_ROWS + 1 against a prepared B (the bfloat16 panels below FEW_ROWS, the fp32 ones above), on
    random, spread, cancelling and NaN/Inf inputs, every preset and schedule family."""
    from mmaemu.cpu.gemm import FEW_ROWS

    rng = np.random.default_rng(hash(("few", fmt_a, fmt_b)) % 2**32)
    for M in range(1, FEW_ROWS + 2):
        for preset, fast, S, scheme in [(HOPPER, True, 1, "none"), (HOPPER, False, 1, "none"),
                                        (HOPPER, True, 3, "contiguous"), (ADA, False, 4, "pairwise"),
                                        (B200_MMA_SYNC, True, 1, "none"), (CUSTOM, True, 5, "serial")]:
            N, K = int(rng.choice([5, 17, 130, 300])), int(rng.choice([7, 129, 385]))
            gen = rng.integers(0, 3)
            if gen == 0:
                a, b = random_codes(rng, fmt_a, (M, K)), random_codes(rng, fmt_b, (N, K))
            elif gen == 1:
                a, b = spread_codes(rng, fmt_a, (M, K)), spread_codes(rng, fmt_b, (N, K))
            else:
                a, b = cancelling_codes(rng, fmt_a, fmt_b, M, N, K)
            if M > 1:
                a[M - 1, K // 2] = NONFINITE[fmt_a][0]
            b[N // 2, 0] = NONFINITE[fmt_b][-1]
            ref = accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, S, scheme, reference=True)
            got = accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, S, scheme,
                                   prepared_b=engine.prepare_b(b, fmt_b))
            assert np.array_equal(_bits(ref), _bits(got)), (M, N, K, preset.name, fast, S, scheme)


def test_few_rows_adversarial_blocks():
    """The hand-built adversarial rows of test_adversarial_blocks, one row at a time, against a prepared B."""
    for fmt_a, fmt_b in PAIRS:
        big_a, tiny_a, norm_a = EXTREMES[fmt_a]
        big_b, tiny_b, norm_b = EXTREMES[fmt_b]
        K = 300
        rows = [np.zeros(K, np.uint8) for _ in range(4)]
        rows[0][0] = big_a; rows[0][1:32] = tiny_a
        rows[1][0] = big_a; rows[1][1] = big_a ^ 0x80; rows[1][2] = tiny_a
        rows[2][:] = norm_a
        rows[3][0] = big_a; rows[3][40:300:3] = tiny_a
        b = np.stack([np.full(K, big_b, np.uint8), np.full(K, tiny_b, np.uint8), np.zeros(K, np.uint8),
                      np.arange(K, dtype=np.uint8) % 0x70] * 5)
        prepared = engine.prepare_b(b, fmt_b)
        for row in rows:
            a = row[None, :].copy()
            for preset, fast in itertools.product((HOPPER, ADA), (True, False)):
                ref = accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, reference=True)
                got = accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, prepared_b=prepared)
                assert np.array_equal(_bits(ref), _bits(got)), (fmt_a, fmt_b, preset.name, fast)

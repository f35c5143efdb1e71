"""The biased formulation (mmaemu.arith.biased, the arithmetic of the cuda:biased kernel) equals the reference
path (accumulate_one) bit for bit, and its primitive fma_toward_zero is IEEE fusedMultiplyAdd rounded toward zero.

The primitive is checked against exact rational arithmetic (its float64 emulation runs on CPUs and in the CUDA
simulator; on a device the hardware instruction computes it). The block step is checked on inputs built against
each step of its proof (mmaemu/arith/biased.py): accumulators whose grid is set by a bias (wide exponent spreads,
subnormals, min_exp far above the products), products routed to the accumulator of their sign (mixed signs,
exact cancellations to +0), the 24-bit window (presets at its edge with maximal same-sign products), the
truncation to frac_out + 1 bits (frac_out < frac), every format pair, fast and slow chains, ragged K; and against
the independent oracle (tests/oracle.py), the contract's accumulate vectors and the Khattak-Mikaitis hardware
recordings (H100 wgmma, Ada mma.sync).
"""

from fractions import Fraction

import numpy as np
import pytest

from mmaemu.arith import biased
from mmaemu.arith.fp32 import (float32_bits, float32_exponent, float32_from_bits, fma_toward_zero,
                               fma_toward_zero_exact, pow2_from_exponent, truncate_significand)
from mmaemu.arith.params import preset_params
from mmaemu.cpu.engine import accumulate_codes
from mmaemu.model.presets import ADA, HOPPER, Preset
from numba import njit

from test_engine_vs_oracle import accumulate_case
from test_fast_path import EXTREMES, PAIRS, cancelling_codes, random_codes, spread_codes
import oracle
from vectors import km_cases, spec_vectors

# The largest blocks the 24-bit window holds (nfma * 2**(frac+2) + 2**(frac+1) <= 2**23) and the first it does not.
EDGE = Preset("biased-edge-32x15", nfma=32, frac=15, frac_out=13, min_exp=-132, late_c=False, slow_chunk=128)
EDGE_LONG = Preset("biased-edge-64x14", nfma=64, frac=14, frac_out=14, min_exp=-132, late_c=False, slow_chunk=128)
OVER = Preset("biased-over-32x16", nfma=32, frac=16, frac_out=13, min_exp=-132, late_c=False, slow_chunk=128)
# frac_out below frac: the block result keeps fewer bits than the grid (the truncation of b.1 step 6 matters).
COARSE_OUT = Preset("biased-8x12-out5", nfma=8, frac=12, frac_out=5, min_exp=-132, late_c=False, slow_chunk=128)
# min_exp above every product exponent: E, and so the grid, set by min_exp.
HIGH_MIN_EXP = Preset("biased-minexp20", nfma=16, frac=13, frac_out=13, min_exp=20, late_c=False, slow_chunk=128)
PRESETS = [HOPPER, ADA, EDGE, EDGE_LONG, COARSE_OUT, HIGH_MIN_EXP]


# ----------------------------------------------------------------------------------------------------------------
# The primitive


def _exact_rz(a, b, c):
    """float32 of a*b + c rounded toward zero, from exact rationals (independent of the emulation)."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    r = np.float32(float(exact))  # within an ulp or two of the answer; step toward it exactly
    while abs(Fraction(float(r))) > abs(exact):
        r = np.nextafter(r, np.float32(0.0))
    while True:
        away = np.nextafter(r, np.float32(np.inf) if exact > 0 else np.float32(-np.inf))
        if exact != 0 and abs(Fraction(float(away))) <= abs(exact):
            r = away
        else:
            return r if exact != 0 else np.float32(0.0) if (a * b != 0 or c != 0 or not np.signbit(c)) else r


def _triples(rng, n):
    """Random float32 triples: general values, products that cancel c exactly or nearly, results at ties and
    halfway points of the fp32 grid, subnormal results, and the biased sums of mmaemu (c a power of two)."""
    out = []
    for _ in range(n):
        kind = rng.integers(0, 5)
        a = np.float32(rng.standard_normal() * 2.0 ** rng.integers(-20, 20))
        b = np.float32(rng.standard_normal() * 2.0 ** rng.integers(-20, 20))
        if kind == 0:
            c = np.float32(rng.standard_normal() * 2.0 ** rng.integers(-40, 40))
        elif kind == 1:  # nearly cancelling
            c = np.float32(-(np.float64(a) * np.float64(b)) * (1 + rng.integers(-3, 4) * 2.0**-23))
        elif kind == 2:  # a bias: c = +-2**n with the product below it (the use in arith.biased)
            c = np.float32(np.sign(rng.standard_normal()) * 2.0 ** rng.integers(-10, 30))
        elif kind == 3:  # exact ties of the fp32 grid: product = half an ulp of c
            c = np.float32(1.0 + rng.integers(0, 2**23) * 2.0**-23)
            a, b = np.float32(2.0**-24 * rng.choice([-1, 1])), np.float32(rng.choice([1.0, 3.0]))
        else:  # subnormal results
            a = np.float32(rng.standard_normal() * 2.0**-70)
            b = np.float32(rng.standard_normal() * 2.0**-70)
            c = np.float32(rng.choice([0.0, -0.0, 2.0**-149, -(2.0**-140)]))
        out.append((a, b, c))
    return out


def test_fma_toward_zero_emulation_is_exact():
    rng = np.random.default_rng(11)
    compiled = njit(lambda a, b, c: fma_toward_zero(a, b, c))
    for a, b, c in _triples(rng, 3000) + [(np.float32(0.0), np.float32(5.0), np.float32(-0.0)),
                                          (np.float32(-1.5), np.float32(2.0), np.float32(3.0))]:
        want = _exact_rz(a, b, c)
        for got in (fma_toward_zero_exact(a, b, c), compiled(a, b, c)):
            assert np.float32(got).view(np.uint32) == want.view(np.uint32), (a, b, c, got, want)


def test_float32_bit_helpers():
    compiled_bits = njit(lambda x: float32_bits(x))
    compiled_from = njit(lambda i: float32_from_bits(i))
    compiled_exp = njit(lambda x: float32_exponent(x))
    compiled_pow2 = njit(lambda n: pow2_from_exponent(n))
    compiled_trunc = njit(lambda x, n: truncate_significand(x, n))
    rng = np.random.default_rng(3)
    for x in np.concatenate([rng.standard_normal(200).astype(np.float32) * 1e3, [1.0, -2.5, 2.0**-126]]):
        x = np.float32(x)
        assert compiled_bits(x) == x.view(np.int32)
        assert compiled_from(np.int32(x.view(np.int32))) == x
        assert compiled_exp(x) == np.floor(np.log2(abs(np.float64(x))))
        for n in (1, 5, 14, 24):
            # toward zero to n significant bits, computed from the exact value
            lead = np.floor(np.log2(abs(np.float64(x))))
            grid = 2.0 ** (lead - n + 1)
            assert compiled_trunc(x, n) == np.float32(np.trunc(np.float64(x) / grid) * grid)
    assert compiled_exp(np.float32(0.0)) == -127
    assert compiled_trunc(np.float32(0.0), 14) == 0 and not np.signbit(compiled_trunc(np.float32(0.0), 14))
    for n in range(-126, 128):
        assert compiled_pow2(np.int32(n)) == np.float32(2.0**n)


# ----------------------------------------------------------------------------------------------------------------
# The block step against the reference


def _decoded(codes, fmt):
    """k-major (pos, neg, exp) arrays [K, rows] of the codes (biased_decode of every code)."""
    from mmaemu.arith.tile import TILE_FORMATS

    fmt_tuple = TILE_FORMATS[fmt]
    table = [biased.biased_decode(np.int64(code), fmt_tuple) for code in range(256)]
    pos = np.array([t[0] for t in table], np.float32)[codes].T
    neg = np.array([t[1] for t in table], np.float32)[codes].T
    exp = np.array([t[2] for t in table], np.int32)[codes].T
    return np.ascontiguousarray(pos), np.ascontiguousarray(neg), np.ascontiguousarray(exp)


def biased_accumulate(a, b, fmt_a, fmt_b, preset, fast, c=None):
    """Accumulators [M, N] of the finite path by biased_block: one chain over K (fast) or a chain per slow_chunk
    k from +0, their fp32 values added in increasing k (slow), then added to +0 (semantics.md c.1, c.2). ``c``
    (fp32 [M, N], fast only): the chain's starting accumulator, as ``mmaemu.model.dot`` takes it."""
    params = preset_params(preset, fmt_a, fmt_b)
    (ap, an, ae), (bp, bn, be) = _decoded(a, fmt_a), _decoded(b, fmt_b)
    M, K = a.shape
    N = b.shape[0]
    c_val = np.zeros((M, N), np.float32) if c is None else np.array(c, np.float32)
    partial = np.zeros((M, N), np.float32)
    work = [np.zeros((M, N), t) for t in (np.int32, np.float32, np.float32)]
    for kb in range(0, K, preset.nfma):
        if not fast and kb and kb % preset.slow_chunk == 0:
            partial, c_val = (partial + c_val).astype(np.float32), np.zeros((M, N), np.float32)
        biased.biased_block(ap, an, ae, 0, bp, bn, be, 0, kb, min(kb + preset.nfma, K), params, c_val, *work)
    return (np.float32(0.0) + (partial + c_val)).astype(np.float32)


def assert_same(a, b, fmt_a, fmt_b, preset, fast):
    want = accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, reference=True)
    got = biased_accumulate(a, b, fmt_a, fmt_b, preset, fast)
    finite = np.isfinite(want)  # NaN/Inf outputs come from the override kernel, not from the block step
    bad = np.argwhere((want.view(np.uint32) != got.view(np.uint32)) & finite)
    if len(bad):
        m, n = bad[0]
        raise AssertionError(f"{len(bad)} outputs differ ({preset.name}, {fmt_a}x{fmt_b}, fast={fast}, "
                             f"K={a.shape[1]}); first at ({m}, {n}): reference {want[m, n]!r} biased {got[m, n]!r}")


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS)
def test_biased_block_equals_reference(preset, fmt_a, fmt_b):
    assert biased.biased_decline(preset.nfma, preset.frac, preset.frac_out, int(preset.late_c)) is None
    rng = np.random.default_rng(abs(hash((preset.name, fmt_a, fmt_b))) % 2**32)
    for fast in (True, False):
        for M, N, K in ((3, 5, 1), (4, 7, 33), (5, 6, 300)):
            assert_same(random_codes(rng, fmt_a, (M, K)), random_codes(rng, fmt_b, (N, K)), fmt_a, fmt_b, preset,
                        fast)
            assert_same(spread_codes(rng, fmt_a, (M, K)), spread_codes(rng, fmt_b, (N, K)), fmt_a, fmt_b, preset,
                        fast)
            a, b = cancelling_codes(rng, fmt_a, fmt_b, M, N, K)
            assert_same(a, b, fmt_a, fmt_b, preset, fast)


@pytest.mark.parametrize("preset", [EDGE, EDGE_LONG, HOPPER], ids=lambda p: p.name)
def test_window_edge_with_maximal_same_sign_products(preset):
    """Blocks of the largest products, all of one sign, on top of a large accumulator: the biased accumulators
    reach the top of their 24-bit window, where one more bit would change the grid."""
    for fmt in ("e4m3", "e5m2"):
        big = EXTREMES[fmt][0]
        K = 4 * preset.nfma + 3
        for sign in (0x00, 0x80):
            a = np.full((2, K), big | sign, np.uint8)
            b = np.full((3, K), big, np.uint8)
            b[1, ::7] = EXTREMES[fmt][1]  # a few subnormals truncated away at the bottom of the grid
            b[2] = big - 1
            for fast in (True, False):
                assert_same(a, b, fmt, fmt, preset, fast)


def test_decline_rules():
    assert biased.biased_decline(OVER.nfma, OVER.frac, OVER.frac_out, 0).startswith("sums a block in the 24-bit")
    assert "early-accumulator" in biased.biased_decline(32, 25, 23, 1)
    assert biased.biased_decline(HOPPER.nfma, HOPPER.frac, HOPPER.frac_out, 0) is None
    assert biased.biased_decline(ADA.nfma, ADA.frac, ADA.frac_out, 0) is None


# ----------------------------------------------------------------------------------------------------------------
# The block step against the independent oracle, the contract's vectors and hardware recordings


def _accepted(preset):
    return not preset.late_c and biased.biased_decline(preset.nfma, preset.frac, preset.frac_out, 0) is None


def test_biased_block_equals_oracle():
    """The random and adversarial cases of test_engine_vs_oracle (unsplit: the biased arithmetic walks one
    schedule level less than accumulate_one; splits are the kernel's walk, checked in the simulator) against
    tests/oracle.py, for every preset the formulation accepts."""
    checked = 0
    for seed in range(400):
        a, b, fa, fb, preset, fast, S, scheme = accumulate_case(seed)
        if not _accepted(preset):
            continue
        want = np.array(oracle.accumulate(a.tolist(), b.tolist(), fa, fb, preset, fast), np.uint32)
        got = biased_accumulate(a, b, fa, fb, preset, fast).view(np.uint32)
        finite = np.isfinite(want.view(np.float32))  # NaN/Inf outputs come from the override kernel
        bad = np.argwhere((want != got) & finite)
        assert not len(bad), f"seed {seed}: {preset.name} {fa}x{fb} fast={fast} K={a.shape[1]} at {bad[0]}"
        checked += int(finite.sum())
    assert checked > 500


@pytest.mark.parametrize("v", [v for v in spec_vectors() if v["api"] == "accumulate" and v["S"] == 1],
                         ids=lambda v: v["id"])
def test_biased_block_reproduces_the_contract_vectors(v):
    from mmaemu.platform.profiles import get_profile
    from mmaemu.model.presets import get_preset

    preset = get_preset(get_profile(v["profile"]).preset, warn=False)
    if not _accepted(preset) or not np.isfinite(np.uint32(v["result"]).view(np.float32)):
        pytest.skip(f"{v['id']}: {preset.name} / non-finite result (not the biased formulation's)")
    a = np.array([v["a"]], np.uint8)
    b = np.array([v["b"]], np.uint8)
    got = int(biased_accumulate(a, b, v["fmt_a"], v["fmt_b"], preset, v["fast"]).view(np.uint32)[0, 0])
    assert got == v["result"], f"{v['id']}: {got:#010x} != {v['result']:#010x}"


@pytest.mark.parametrize("gpu,fmt,preset,uses_c", [("H100", "E4M3", HOPPER, False), ("H100", "E5M2", HOPPER, False),
                                                   ("Ada", "E4M3", ADA, True), ("Ada", "E5M2", ADA, True)],
                         ids=str)
def test_biased_block_reproduces_hardware_vectors(gpu, fmt, preset, uses_c):
    """Khattak-Mikaitis recordings of single K = 32 FP8 instructions (H100 wgmma with c = 0; Ada mma.sync with
    its c). The formulation is claimed for accumulators of GEMM chains (at least 2**-32 when nonzero,
    mmaemu/arith/biased.py condition 2), so Ada cases whose c is subnormal or tiny, or whose result is not
    finite, are left to test_vectors.py."""
    a, b, c, d = km_cases(gpu, fmt)
    f = fmt.lower()
    c32 = np.asarray(c, np.uint32).view(np.float32) if uses_c else np.zeros(len(d), np.float32)
    d32 = np.asarray(d, np.uint32).view(np.float32)
    keep = np.isfinite(c32) & ((c32 == 0) | (np.abs(c32) >= 2.0**-32)) & np.isfinite(d32)
    assert keep.sum() > 4000
    for i in np.flatnonzero(keep):
        got = biased_accumulate(a[i:i + 1], b[i:i + 1], f, f, preset, True, c=c32[i:i + 1].reshape(1, 1))
        assert got.view(np.uint32)[0, 0] == np.uint32(d[i]), (gpu, fmt, int(i))

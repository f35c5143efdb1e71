"""The fp32 primitives of the offset formulation (mmaemu.arith.fp32): fma_toward_zero is IEEE fusedMultiplyAdd
rounded toward zero, checked against exact rational arithmetic (its float64 emulation runs on CPUs and in the CUDA
simulator; on a device the hardware instruction computes it), and the bit helpers are the bit casts they claim."""

from fractions import Fraction

import numpy as np
from numba import njit

from mmaemu.arith.fp32 import (float32_bits, float32_from_bits, fma_toward_zero, fma_toward_zero_exact,
                               truncate_significand)


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
    halfway points of the fp32 grid, subnormal results, and the offset sums of mmaemu (c = +-1.5 * 2**n)."""
    out = []
    for _ in range(n):
        kind = rng.integers(0, 5)
        a = np.float32(rng.standard_normal() * 2.0 ** rng.integers(-20, 20))
        b = np.float32(rng.standard_normal() * 2.0 ** rng.integers(-20, 20))
        if kind == 0:
            c = np.float32(rng.standard_normal() * 2.0 ** rng.integers(-40, 40))
        elif kind == 1:  # nearly cancelling
            c = np.float32(-(np.float64(a) * np.float64(b)) * (1 + rng.integers(-3, 4) * 2.0**-23))
        elif kind == 2:  # an offset: c = +-1.5 * 2**n with the product below it (the use in arith.offset)
            c = np.float32(np.sign(rng.standard_normal()) * 1.5 * 2.0 ** rng.integers(-10, 30))
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
    compiled_trunc = njit(lambda x, n: truncate_significand(x, n))
    rng = np.random.default_rng(3)
    for x in np.concatenate([rng.standard_normal(200).astype(np.float32) * 1e3, [1.0, -2.5, 2.0**-126]]):
        x = np.float32(x)
        assert compiled_bits(x) == x.view(np.int32)
        assert compiled_from(np.int32(x.view(np.int32))) == x
        for n in (1, 5, 14, 24):
            # toward zero to n significant bits, computed from the exact value
            lead = np.floor(np.log2(abs(np.float64(x))))
            grid = 2.0 ** (lead - n + 1)
            assert compiled_trunc(x, n) == np.float32(np.trunc(np.float64(x) / grid) * grid)
    assert compiled_trunc(np.float32(0.0), 14) == 0 and not np.signbit(compiled_trunc(np.float32(0.0), 14))

"""Exact IEEE round-to-nearest-even conversions done with integers (semantics.md conventions, (e)).

Values travel as float64 holding an exact value (every fp32 value and every product of two fp32 values is
exact and normal in float64). Rounding into a narrower format is integer code on the float64 significand,
so the result never depends on the processor's flush-to-zero or denormals-are-zero modes.

A format is ``(frac_bits, exp_bits, ieee_specials)``: bias ``2**(exp_bits-1) - 1``, gradual underflow. With
``ieee_specials`` the all-ones exponent field encodes Inf/NaN and overflow gives Inf; E4M3 (``float8_e4m3fn``)
has no Inf and uses that field for finite values up to 448 (callers clamp FP8 outputs before rounding).
"""

import math

import numpy as np

from ..base._jit import arithmetic, arithmetic_inlined

FLOAT32 = (23, 8, 1)
BFLOAT16 = (7, 8, 1)
FLOAT16 = (10, 5, 1)
E4M3 = (3, 4, 0)
E5M2 = (2, 5, 1)


@arithmetic
def float64_significand(x):
    """``(sig, exp)`` with ``|x| = sig * 2**exp`` and ``2**52 <= sig < 2**53`` for finite nonzero x."""
    m, e = math.frexp(abs(x))
    return np.int64(m * 9007199254740992.0), e - 53


@arithmetic
def shift_rne(sig, shift):
    """``sig * 2**-shift`` rounded to nearest, ties to even (sig >= 0, shift >= 0)."""
    if shift == 0:
        return sig
    if shift > 60:
        return 0  # sig < 2**53 is below half of 2**shift
    q = sig >> shift
    rem = sig & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and (q & 1) == 1):
        q += 1
    return q


@arithmetic
def round_to_format(x, fmt):
    """Bit pattern of RNE(x) in format ``fmt`` (x: exact float64, not NaN; overflow gives Inf)."""
    frac_bits, exp_bits, ieee_specials = fmt
    bias = (1 << (exp_bits - 1)) - 1
    sign = np.int64(1) if math.copysign(1.0, x) < 0 else np.int64(0)
    sign_bit = sign << (exp_bits + frac_bits)
    inf_bits = sign_bit | (((1 << exp_bits) - 1) << frac_bits)
    if x == 0:
        return sign_bit
    if math.isinf(x):
        return inf_bits
    sig, e = float64_significand(x)
    grid = max(e + 52, 1 - bias) - frac_bits
    q = shift_rne(sig, grid - e)
    if q >= (1 << (frac_bits + 1)):
        q >>= 1
        grid += 1
    if q < (1 << frac_bits):
        return sign_bit | q  # subnormal (or zero)
    field = grid + frac_bits + bias
    if ieee_specials and field >= (1 << exp_bits) - 1:
        return inf_bits
    return sign_bit | (field << frac_bits) | (q - (1 << frac_bits))


@arithmetic
def value_of_bits(bits, fmt):
    """The exact float64 value of a bit pattern of an IEEE-style ``fmt`` (NaN for NaN patterns)."""
    frac_bits, exp_bits, ieee_specials = fmt
    bias = (1 << (exp_bits - 1)) - 1
    mant = bits & ((1 << frac_bits) - 1)
    field = (bits >> frac_bits) & ((1 << exp_bits) - 1)
    negative = (bits >> (frac_bits + exp_bits)) & 1
    if field == (1 << exp_bits) - 1:
        value = math.inf if mant == 0 else math.nan
    elif field == 0:
        value = math.ldexp(np.float64(mant), 1 - bias - frac_bits)
    else:
        value = math.ldexp(np.float64(mant | (1 << frac_bits)), field - bias - frac_bits)
    return -value if negative else value


@arithmetic
def round_float32(x):
    """RNE_fp32(x) as an exact float64 (x exact, NaN propagates)."""
    if x != x:
        return x
    return value_of_bits(round_to_format(x, FLOAT32), FLOAT32)




@arithmetic_inlined
def grid_code(y_bits, grid_bits, mid_bits, mbits, emin, sign_bit, nan_code):
    """The code of the fp32 value of bits ``y_bits`` (uint32) rounded onto a small float format's grid: nearest,
    ties to the even code, saturating at the largest finite value (±Inf too), the sign bit ``sign_bit`` set for
    a negative y (also one that rounds to zero), ``nan_code`` for NaN. Integer code, branch-free.

    ``grid_bits``: the fp32 bits of the values of the codes 0 .. n-1, the format's finite non-negative codes,
    increasing (code i has value grid[i]); ``mid_bits[i]``: the fp32 bits of (grid[i] + grid[i + 1]) / 2, exact
    (at most 5 significant bits); ``mbits``/``emin``: the format's mantissa bits and smallest normal exponent.
    Non-negative fp32 values order as their bit patterns (Inf above every finite one), so every comparison is a
    comparison of exact values. With |y| clamped to grid[n-1], the largest code f with grid[f] <= |y| is read off
    the bits: with e = max(exponent of |y|, emin) and sig its 24-bit significand (the implicit bit set for a
    normal fp32), ``f = (sig >> (23 - mbits + e - exponent)) + ((e - emin) << mbits)`` (a normal |y| >= 2**emin:
    the binade's first code (e - emin + 1) * 2**mbits plus the top mbits of the fraction; a smaller one:
    floor(|y| / 2**(emin - mbits)), the subnormal code; shifts capped at 31, beyond which sig gives 0). So
    ``lo = f + (grid[f] < |y|)`` is the number of grid values below |y| (numpy's ``searchsorted(side="left")``),
    and the result is the nearer of grid[lo] and grid[lo - 1], the even code on a tie.
    """
    magnitude = y_bits & np.uint32(0x7FFFFFFF)
    nan = magnitude > np.uint32(0x7F800000)
    n = grid_bits.shape[0]
    clamped = min(magnitude, grid_bits[n - 1])
    field = np.int32(clamped >> np.uint32(23))
    exponent = field - np.int32(127)
    e = max(exponent, np.int32(emin))
    sig = np.int32(clamped & np.uint32(0x7FFFFF)) | (np.int32(1 if field != 0 else 0) << np.int32(23))
    shift = min(np.int32(23 - mbits) + (e - exponent), np.int32(31))
    f = (sig >> shift) + ((e - np.int32(emin)) << np.int32(mbits))
    # Compiled into its caller's loop (arithmetic_inlined: no call with two arrays per element), the tables read
    # at unsigned indices (all lie in 0 .. n-1: no negative-index wrap-around code) and the conditions joined by
    # & and |, not and/or (no branches): the MX cast of (64, 576) took 1.65x less CPU time (docs/performance.md).
    u = np.uint64
    lo = f + np.int32(grid_bits[u(f)] < clamped)
    upper = min(lo, np.int32(n - 1))
    lower = max(upper - np.int32(1), np.int32(0))
    midpoint = mid_bits[u(lower)]
    take_upper = (grid_bits[u(upper)] == clamped) | (clamped > midpoint) | ((clamped == midpoint) &
                                                                            ((upper & np.int32(1)) == 0))
    code = np.int32(upper if take_upper else lower) | (np.int32(sign_bit) if y_bits >> np.uint32(31) else np.int32(0))
    return np.int32(nan_code) if nan else code

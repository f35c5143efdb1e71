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

from .._jit import arithmetic

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

"""The packed bf16 fused multiply-add of the power-sum exponent pass (:mod:`.power_sums`), exactly.

* :func:`fma_bf16x2` - PTX ``fma.rn.bf16x2`` (sm_80 and newer, SASS ``HFMA2.BF16_V2``): in each 16-bit half of
  the uint32 words, the bf16 ``a * b + c`` rounded once to nearest, ties to even (IEEE fusedMultiplyAdd,
  roundTiesToEven, on bfloat16: 8 significant bits, exponents -126 to 127, subnormals down to 2**-133).
* :func:`low_halves` / :func:`high_halves` - a word with its low (high) half in both halves. In kernels the PTX
  ``mov.b32 {lo, hi}, x; mov.b32 y, {lo, lo}``, which ptxas folds into the next bf16x2 instruction as an operand
  swizzle (``.H0_H0`` / ``.H1_H1``): a column's power broadcast to two outputs costs no instruction.

Each is an exact function of its arguments. CPUs and numba's CUDA simulator run the twins here
(:func:`fma_bf16x2_exact`, :func:`low_halves_exact`, :func:`high_halves_exact`); CUDA kernels get the PTX,
registered as ``target="cuda"`` overloads by :mod:`mmaemu.cuda.offset.ptx`. ``tests/test_offset.py`` checks the twins
against exact rationals (ties, the overflow threshold, subnormals, signed zeros).

The bf16 twin: a bf16 value is the fp32 with the same top 16 bits, so ``p = a * b`` is exact in float64 (8 + 8
significant bits, exponents -266 to 256), and TwoSum gives ``s = RN64(p + c)`` and its error ``err`` exactly
(``s + err = p + c``; no float64 overflow or underflow in that range). :func:`round_bf16` then rounds the exact
sum ``s + err`` once: on the bf16 grid of |s| (the ulp ``2**(max(q, -126) - 7)``, q the exponent of |s|), the
remainder of |s| decides, and only an exact half-way remainder (a tie for |s|) looks at the sign of err: a bf16
half-way point has 9 significant bits, so if ``s + err`` were one, s would be it (float64 holds it exactly), and
a remainder other than one half puts ``s + err`` on the same side as s (|err| is below half a float64 ulp of s).
A result of 2**128 or more is infinite (IEEE overflow under round to nearest), one below 2**-133 / 2 rounds to a
zero of the sum's sign, an exact zero sum takes the sign IEEE gives it (float64 addition follows the same rule),
and NaN or infinite operands give a NaN (the canonical 0x7FFF; mmaemu never passes them) or an infinity.
"""

import math

import numpy as np

from ..base._jit import arithmetic
from .fp32 import float32_bits, float32_from_bits
from .packed import overload_on_words

BF16_INF = 0x7F80
BF16_NAN = 0x7FFF
BF16_SIGN = 0x8000
BF16_MIN_EXPONENT = -126  # of a normal bf16
BF16_SIGNIFICAND_BITS = 8
HALF_PAIR = 0x00010001  # x * HALF_PAIR puts a 16-bit x in both halves


@arithmetic
def bf16_value(half):
    """The float64 value of the bf16 bit pattern ``half`` (the low 16 bits of an integer)."""
    bits = np.int32(np.uint32(np.uint32(half) & np.uint32(0xFFFF)) << np.uint32(16))
    return np.float64(float32_from_bits(bits))


@arithmetic
def round_bf16(s, err):
    """The bf16 bit pattern of the exact sum ``s + err`` rounded to nearest, ties to even, where ``s`` is that sum
    rounded to float64 and ``err`` its exact error (TwoSum); see the module docstring."""
    if s != s:
        return np.uint32(BF16_NAN)
    sign = np.uint32(BF16_SIGN) if (s < 0.0 or (s == 0.0 and math.copysign(1.0, s) < 0.0)) else np.uint32(0)
    if s == 0.0:
        return sign
    magnitude = abs(s)
    toward = err if s > 0.0 else -err  # the exact |sum| is magnitude + toward
    if math.isinf(magnitude):
        return sign | np.uint32(BF16_INF)
    exponent = math.frexp(magnitude)[1] - 1  # 2**exponent <= magnitude < 2**(exponent + 1)
    ulp = max(exponent, BF16_MIN_EXPONENT) - (BF16_SIGNIFICAND_BITS - 1)
    units = math.ldexp(magnitude, -ulp)
    whole = math.floor(units)
    rest = units - whole
    if rest > 0.5 or (rest == 0.5 and (toward > 0.0 or (toward == 0.0 and whole % 2.0 == 1.0))):
        whole += 1.0
    value = math.ldexp(whole, ulp)
    if value >= 2.0 ** 128:
        return sign | np.uint32(BF16_INF)
    return sign | np.uint32(np.uint32(float32_bits(np.float32(value))) >> np.uint32(16))


@arithmetic
def fma_bf16_exact(a, b, c):
    """bf16 ``a * b + c`` rounded once to nearest even, of the bf16 bit patterns a, b, c (low 16 bits)."""
    p = bf16_value(a) * bf16_value(b)
    q = bf16_value(c)
    s = p + q
    if math.isinf(s) or s != s:
        return round_bf16(s, 0.0)
    v = s - p
    err = (p - (s - v)) + (q - v)
    return round_bf16(s, err)


@arithmetic
def fma_bf16x2_exact(a, b, c):
    """:func:`fma_bf16_exact` on the low and on the high halves of the uint32 words a, b, c, packed."""
    u = np.uint32
    lo = fma_bf16_exact(u(a) & u(0xFFFF), u(b) & u(0xFFFF), u(c) & u(0xFFFF))
    hi = fma_bf16_exact(u(a) >> u(16), u(b) >> u(16), u(c) >> u(16))
    return u((hi << u(16)) | lo)


@arithmetic
def low_halves_exact(x):
    """The uint32 with the low half of x in both halves."""
    return np.uint32((np.uint32(x) & np.uint32(0xFFFF)) * np.uint32(HALF_PAIR))


@arithmetic
def high_halves_exact(x):
    """The uint32 with the high half of x in both halves."""
    return np.uint32((np.uint32(x) >> np.uint32(16)) * np.uint32(HALF_PAIR))


def fma_bf16x2(a, b, c):
    """uint32 word of the per-half bf16 fused multiply-adds ``a * b + c``, rounded to nearest even."""
    return fma_bf16x2_exact(a, b, c)


def low_halves(x):
    """uint32 word with the low half of x in both halves."""
    return low_halves_exact(x)


def high_halves(x):
    """uint32 word with the high half of x in both halves."""
    return high_halves_exact(x)


overload_on_words(fma_bf16x2, fma_bf16x2_exact, "generic")
overload_on_words(low_halves, low_halves_exact, "generic")
overload_on_words(high_halves, high_halves_exact, "generic")

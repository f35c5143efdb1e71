"""The offset block step's per-output arithmetic written once, on lanes (:mod:`.lanes`): the start (b.1 steps
2-3 and the accumulator's term of step 4), the flags of the products to correct, and the block end.

Each function compiles on 32-bit scalars (``cuda:offset``'s threads through :mod:`.offset`, the CPU's scalar
loops) and on the CPU's 512-bit vectors (:mod:`mmaemu.cpu.offset_kernel`), from this one source; the proofs
are those of :mod:`.offset` (conditions 1-9), lane by lane. ``v`` is a named tuple of the step's constants with
the fields of :class:`StepConstants` (int32 patterns, ``one`` fp32 1.0), scalars (:func:`step_scalars`) or
vectors of them (:func:`mmaemu.cpu.offset_kernel.block_vectors`).
"""

from typing import NamedTuple

import numpy as np

from ..base._jit import arithmetic
from .fp32 import FP32_EXPONENT_BIAS, FP32_FRACTION_BITS
from .lanes import (abs_f32, add_f32, add_i32, and_i32, andnot_i32, bits_of_f32, f32_of_bits, fma_toward_zero_f32,
                   lshr_i32, max_f32, max_i32, min_i32, mul_i32, or_i32, shl_i32, sub_f32, sub_i32, xor_i32)
from .packed import BYTE_ONES

SIGN_BIT = -0x80000000  # fp32's sign bit (int32)
EXPONENT_FIELD_I32 = 0xFF800000 - 2**32  # fp32's sign and exponent field (int32)


class StepConstants(NamedTuple):
    """The constants of the per-output step (module docstring): of the call's
    :class:`~.offset.OffsetConstants` and the fp32 bit masks."""

    exponent_bias: object  # (s + 127) * 2**23 is the pattern of 2**s (the CPU's byte exponent pass)
    floor: object  # the pattern of 2**e_floor
    m_add: object
    tau_add: object
    tau_max: object
    top4: object
    byte_sum: object  # 0x01010101
    sign_bit: object
    one: object  # fp32 1.0
    zero: object
    exponent_field: object
    mantissa: object


@arithmetic
def step_scalars(constants):
    """:class:`StepConstants` of scalars for :class:`~.offset.OffsetConstants` (the masks: compile-time constants)."""
    i32 = np.int32
    return StepConstants(i32(FP32_EXPONENT_BIAS << FP32_FRACTION_BITS), i32(constants.floor_bits),
                         i32(constants.m_add), i32(constants.tau_add), i32(constants.tau_max), i32(constants.top4),
                         i32(BYTE_ONES), i32(SIGN_BIT), np.float32(1.0), i32(0),
                         i32(EXPONENT_FIELD_I32), i32(constants.mantissa))


@arithmetic
def step_start(product_bits, c, v, clamp_low):
    """The offset sum ``M + trunc(c / u) * u`` and the threshold word (T in each byte) of an output whose block
    has the product exponent pattern ``product_bits`` (2**E_prod, or a pattern below the floor's) and the
    accumulator c: E is the exponent of ``max(2**E_prod, 2**e_floor, |c|)`` (fp32 maxima, conditions 2, 9).
    ``clamp_low``: clamp the threshold's shift at 0 (the power sums' tables do without, condition 14)."""
    c_bits = bits_of_f32(c)
    top = bits_of_f32(max_f32(max_f32(f32_of_bits(product_bits), f32_of_bits(v.floor)), abs_f32(c)))
    e_field = lshr_i32(top, FP32_FRACTION_BITS)  # E + 127 (top is a positive pattern)
    m_bits = add_i32(shl_i32(e_field, FP32_FRACTION_BITS), v.m_add)
    signed_m = f32_of_bits(or_i32(m_bits, and_i32(c_bits, v.sign_bit)))
    acc = add_f32(f32_of_bits(m_bits), sub_f32(fma_toward_zero_f32(c, v.one, signed_m), signed_m))
    shift = add_i32(e_field, v.tau_add)
    if clamp_low:
        shift = max_i32(shift, v.zero)
    return acc, sub_i32(v.top4, mul_i32(min_i32(shift, v.tau_max), v.byte_sum))


@arithmetic
def correction_flags(low_a, low_b, sign_a, sign_b, threshold):
    """Bit 7 of each byte (one k of a 4-k group) set for the products floored one unit too far:
    ``~(low_a + low_b + T) & (sign_a ^ sign_b)`` (conditions 4, 5)."""
    return andnot_i32(add_i32(add_i32(low_b, low_a), threshold), xor_i32(sign_b, sign_a))


@arithmetic
def step_end(s, n, v):
    """The block sum ``S + n units - M`` (exact; +0 when zero) of the offset sum S and the count n of products to
    correct: n added to S's pattern (units of its ulp, u), M rebuilt from S's exponent and ``v.mantissa``."""
    bits = add_i32(bits_of_f32(s), n)
    m = f32_of_bits(or_i32(and_i32(bits, v.exponent_field), v.mantissa))
    return sub_f32(f32_of_bits(bits), m)

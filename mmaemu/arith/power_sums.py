"""The block exponent by bf16 power sums (E4M3 x E4M3): one fused multiply-add per product, for two outputs.

b.1 step 2 needs, per output and block, ``E_prod``: the largest exponent sum ``ea + eb`` of the block's nonzero
products (subnormal factors at their format's emin, as :func:`mmaemu.formats.exponents` gives them). The add-max
pass of :mod:`.offset` adds and compares exponents; this pass adds *powers* instead (shared/design/gpu-kernels.md,
section 2). Each E4M3 element carries its power, the bf16 number ``2**(8 * e - 7)`` (:func:`power_bits`; +0 for
zero, NaN and Inf codes, the absent terms), so the product of two powers is ``2**(8 * (ea + eb) - 14)``. One
:func:`~.bf16.fma_bf16x2` of a row pair's power word (the two rows in the halves) and a column's power
(:func:`~.bf16.low_halves` / :func:`~.bf16.high_halves`: broadcast to both halves, free in SASS) adds one product
to the sums of two outputs. Every sum starts at ``-2**-126`` (:data:`POWER_START`); at the block's end the
exponent field F of a sum is ``8 * E_prod + 113 + j`` with ``0 <= j <= 6``, so ``F >> 3 = E_prod + 14``, and a
sum without products is still ``-2**-126``. :func:`power_product_bits` turns a sum into an fp32 pattern in the
binade of ``2**E_prod`` (one shift and one add), which :func:`mmaemu.arith.offset.offset_start` weighs against
the floor and the accumulator.

Exactness conditions (proven here, each tested on both sides of its bound in ``tests/test_offset.py``):

10. *Powers and products are exact normal bf16 numbers.* E4M3 exponents e lie in [-6, 8]: the powers' exponents
    ``8e - 7`` lie in [-55, 57]; exponent sums ``s = ea + eb`` in [-12, 16]: the products' exponents
    ``8s - 14`` in [-110, 114], inside the normal range [-126, 127], so the fma's product is exact and only its
    addition rounds. (E5M2, exponents -14 to 15, would need 8 * 58 + 6 exponents where bf16 has 253: other
    format pairs keep the add-max pass.)
11. *The sum's binade.* Let ``T = 2**(8 * E_prod - 14)`` be the block's largest product and n <= POWER_TERMS = 127
    the number of its products; each term t is +0 or a power of two at most T, and each fma gives
    ``s' = RN(s + t)`` (round to nearest even, monotone, exact on representable values). Upper bound: after m
    nonzero terms ``s <= m * T``, by induction: ``s + t <= (m + 1) * T``, an integer below 128 times a power of
    two, which bf16 holds (8 significant bits), so ``RN(s + t) <= (m + 1) * T``. Lower bound: every s is at least
    the start ``-2**-126`` (the terms are not negative); when T is added, ``s + T >= T - 2**-126``, and
    ``2**-126`` is below half the gap under T (``2**(8 * E_prod - 14 - 9) >= 2**-119``), so RN gives T, and every
    later s is at least T. Hence ``T <= s < 2**7 * T``: F is ``8 * (E_prod + 14) + 1 + j``, j in [0, 6], and
    ``F >> 3 = E_prod + 14`` whatever the order of the terms. F is at most ``8 * 16 + 113 + 6 = 247``: finite.
    The bound is tight: 128 products equal to T sum to ``2**7 * T``, one binade up, and read ``E_prod + 1``.
    (The design note's "33 terms below 64**(E+1)" is the same argument with 6 for 8.)
12. *Absent terms and empty blocks.* Zero, NaN and Inf codes have the power +0: the product ``+0 * x`` is +0 and
    ``RN(s + 0) = s`` for the nonzero s the sums always hold (``-2**-126`` until the first product, at least T
    after it), so they contribute nothing. A block without products keeps ``s = -2**-126``, the bf16 pattern
    0x8080, whose sign bit is set. (A start of -0 would not do: its first absent term gives ``-0 + +0 = +0``, and
    +0 reads as E = -14, above the floor.)
13. *Reading E.* :func:`power_product_bits` puts the output's half in the top 16 bits of an int32 and shifts it
    right by 3 (arithmetic): bits 23-31 are the half's top six bits x (its sign and ``F >> 3``) sign-extended,
    bits 0-22 lower bits of the half; adding ``power_add() = (127 - 14) * 2**23`` (low 23 bits zero, no carry into
    bit 23) makes bits 23-31 ``x + 113``. For a block with products ``x = E_prod + 14`` in [2, 30]: a positive
    fp32 in ``[2**E_prod, 2**(E_prod + 1))``. Without products ``x = 0x8080 >> 10 = -32`` (arithmetic): the fp32
    in ``[2**-46, 2**-45)``, below the floor ``2**e_floor``, ``e_floor >= lo = -18`` (condition 2 of
    :mod:`.offset`), so it never sets E. The mantissa bits do not matter: :func:`~.offset.offset_start` reads only
    the exponent field of the largest of P, the floor and |c|, which is that of the largest of their binades.
    Subnormal factors (condition 10 holds at e = -6) enter with emin's power, the exponent b.1 aligns them with.

Layout (the *paired* words of :func:`mmaemu.arith.offset.offset_pack`): the exponent word ``exp[w, 2p + i]`` of a
staged operand holds the powers of rows 2p (low half) and 2p + 1 (high half) at ``k = 2w + i``, so a tile's words
of one w are the same 16-byte vectors the add-max pass reads, and a column pair's words serve four outputs.
"""

import numpy as np

from ..base._jit import arithmetic
from .bf16 import fma_bf16x2, high_halves, low_halves
from .fp32 import FP32_EXPONENT_BIAS, FP32_FRACTION_BITS
from .packed import load_words4

POWER_SPACING = 8  # the power of an exponent e is 2**(POWER_SPACING * e + POWER_OFFSET) (conditions 10-11)
POWER_OFFSET = -7
POWER_SHIFT = 10  # half >> 10 = the half's sign and exponent field // POWER_SPACING (condition 13)
POWER_START = 0x8080  # -2**-126, the bf16 every power sum starts from (conditions 11-12)
POWER_TERMS = 127  # at most this many products per block (condition 11)
POWER_FORMATS = ("e4m3", "e4m3")  # the pair whose exponents the bf16 range holds (condition 10)


def power_bits(exponents):
    """The bf16 patterns (uint32) of the powers ``2**(POWER_SPACING * e + POWER_OFFSET)`` of the exponents e
    (condition 10); ValueError if one is not a normal bf16 number."""
    field = POWER_SPACING * np.asarray(exponents, np.int64) + POWER_OFFSET + FP32_EXPONENT_BIAS
    if np.any((field < 1) | (field > 254)):
        raise ValueError("a power outside the normal bf16 range")
    return (field << 7).astype(np.uint32)


def power_add() -> int:
    """The int32 that :func:`power_product_bits` adds: ``(127 - q) * 2**23`` with ``q = F >> 3`` of a product of
    exponent sum 0 (condition 13; 113 << 23 for the shipped constants)."""
    field = 2 * POWER_OFFSET + FP32_EXPONENT_BIAS  # F of the product of two powers of exponent 0
    return (FP32_EXPONENT_BIAS - (field >> (POWER_SHIFT - 7))) << FP32_FRACTION_BITS


@arithmetic
def power_product_bits(sums, high, add):
    """An int32 fp32 pattern in the binade of ``2**E_prod`` (condition 13) of the output in the high (``high`` = 1)
    or low half of a power-sum word; ``add`` is :func:`power_add`."""
    i32, u32 = np.int32, np.uint32
    half = i32(u32(sums) << u32(16 - 16 * high))  # the output's half in the top 16 bits
    return i32(i32(half >> i32(POWER_SHIFT + 16 - FP32_FRACTION_BITS)) + add)


@arithmetic
def power_products(sums, a_even, a_odd, b_even, b_odd, high):
    """``sums`` plus the products of one exponent word (k = 2w, 2w + 1) for two outputs: a row pair's power words
    at the even and odd k (rows in the halves) times the half ``high`` of its column pair's words, broadcast."""
    if high:
        b_even, b_odd = high_halves(b_even), high_halves(b_odd)
    else:
        b_even, b_odd = low_halves(b_even), low_halves(b_odd)
    return fma_bf16x2(a_odd, b_odd, fma_bf16x2(a_even, b_even, sums))


@arithmetic
def power_word(a_exp, r0, b_exp, j0, w, sums, first, start):
    """Word w (k = 2w, 2w + 1) into the power sums of the tile: ``sums[p, j]`` holds those of the outputs
    (r0 + 2p, j0 + j) and (r0 + 2p + 1, j0 + j), ``start`` before the first word (``first``)."""
    rows, lanes = sums.shape
    u = np.uint32
    for r in range(0, rows, 4):
        # row pairs r / 2 (words a0 at k = 2w, a1 at 2w + 1) and r / 2 + 1 (a2, a3)
        a0, a1, a2, a3 = load_words4(a_exp, w, r0 + u(r))
        p = r >> 1
        for j in range(0, lanes, 4):
            b0, b1, b2, b3 = load_words4(b_exp, w, j0 + u(j))  # column pairs j / 2 (b0, b1) and j / 2 + 1 (b2, b3)
            for c in range(4):
                b_even, b_odd = (b0, b1) if c < 2 else (b2, b3)
                low = start if first else sums[p, j + c]
                high = start if first else sums[p + 1, j + c]
                sums[p, j + c] = power_products(low, a0, a1, b_even, b_odd, c & 1)
                sums[p + 1, j + c] = power_products(high, a2, a3, b_even, b_odd, c & 1)


@arithmetic
def power_exponent_pass(a_exp, r0, b_exp, j0, w0, w1, start, sums):
    """b.1 steps 1-2 by power sums over the words w in [w0, w1) (a multiple of 4, at least 4): ``sums[p, j]``
    (p < rows / 2) = the bf16 sums from ``start`` (POWER_START in both halves) of the products of the powers of
    the outputs (r0 + 2p, j0 + j) (low half) and (r0 + 2p + 1, j0 + j) (high half); nothing is read on entry.
    Four words per pass; rows, lanes, r0 and j0 multiples of 4."""
    u = np.uint32
    power_word(a_exp, r0, b_exp, j0, w0, sums, True, start)
    power_word(a_exp, r0, b_exp, j0, u(w0 + u(1)), sums, False, start)
    power_word(a_exp, r0, b_exp, j0, u(w0 + u(2)), sums, False, start)
    power_word(a_exp, r0, b_exp, j0, u(w0 + u(3)), sums, False, start)
    w = u(w0 + u(4))
    while w < w1:
        power_word(a_exp, r0, b_exp, j0, w, sums, False, start)
        power_word(a_exp, r0, b_exp, j0, u(w + u(1)), sums, False, start)
        power_word(a_exp, r0, b_exp, j0, u(w + u(2)), sums, False, start)
        power_word(a_exp, r0, b_exp, j0, u(w + u(3)), sums, False, start)
        w = u(w + u(4))

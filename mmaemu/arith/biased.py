"""The early-accumulator block step (semantics.md b.1) for a register tile, with biased fp32 accumulators whose
round-toward-zero additions do the truncation: the formulation of the ``cuda:biased`` kernel.

:func:`~.schedule.accumulate_one` is the reference; :mod:`.tile` computes the same bits with fp32 products
converted to integers (``trunc(a * P * b)``), one float-to-integer conversion per product, an instruction sm_90
GPUs run at an eighth of their fp32 rate. Here every product is one fp32 fused multiply-add rounding toward
zero (:func:`~.fp32.fma_toward_zero`), an operation correctly rounded by definition and run at the full fp32
rate, and the block's exponent maximum is an int32 add-then-max (one instruction on sm_90).

The formulation, for one output and one block with alignment exponent E and grid ``u = 2**(E - frac)``:

* ``B = 2**(E - frac + 23)``, the fp32 whose unit in the last place is u. Two accumulators start at
  ``P = fma_toward_zero(max(c, 0), 1, B)`` and ``N = fma_toward_zero(min(c, 0), 1, -B)``: ``B + c`` rounded
  toward zero onto the grid is ``B + trunc(c / u) * u`` (|c| < 2**(E+1) <= B), likewise for ``-B``.
* Every product is added to one of them, ``P = fma_toward_zero(a, b, P)`` for ``a * b >= 0`` and the same into
  N for ``a * b <= 0``. While ``B <= |P| < 2 * B`` (and likewise N), the exact sum rounded toward zero drops
  exactly the bits of the product below u, toward zero: ``P + trunc(a * b / u) * u``. The operands are
  staged split by sign (``a_pos = max(a, 0)``, ``a_neg = min(a, 0)``, same for b), so the four products
  ``a_pos*b_pos``, ``a_neg*b_neg`` (into P) and ``a_pos*b_neg``, ``a_neg*b_pos`` (into N) route each product to
  the right accumulator with no branch: three of the four are +-0 and leave the accumulator unchanged.
* The truncated block sum is ``S * u = P + N`` (one fp32 add, exact: ``(P - B) + (N + B)`` with both parts
  multiples of u and ``|S| < 2**23``), and the block result is ``S * u`` truncated to frac_out + 1 significant
  bits (b.1 step 6): its low mantissa bits cleared (:func:`~.fp32.truncate_significand`).

Exactness needs (checked by :func:`biased_decline`, proven here):

1. ``|S|`` stays below 2**23 while it is summed, so that P and N keep the unit u: the accumulator's term is
   below 2**(frac+1) units and each product below 2**(frac+2), so ``nfma * 2**(frac+2) + 2**(frac+1) <= 2**23``.
2. B is a normal fp32: ``E - frac + 23`` in [-126, 127]. E is raised to at least ``frac - 149``: every real term
   of a GEMM block has an exponent of at least -32 (products: -28, accumulators: multiples of 2**-32, see
   :mod:`.tile` (2)), above ``frac - 149`` for frac <= 40, so the floor only meets blocks without a nonzero
   term, whose result is +0 on any grid. The top is far: exponents stay below 127 - 23 for any K < 2**60.
3. A nonzero block result is at least ``u >= 2**(-32 - 40)``: normal, so clearing mantissa bits truncates to
   frac_out + 1 significant bits at the grid ``2**(lead - frac_out)`` of b.1 step 6 (the -126 floor of the
   reference never applies), and a zero result is +0 (``x + (-x)`` is +0 in fp32 addition).
4. The accumulator c is an fp32 value (:mod:`.tile` (4)); its leading exponent is its exponent field, and a
   +0 accumulator reads -127, below every real term, so it never sets E (as the reference's ``NO_LEAD``).
   Zero, NaN and Inf codes are staged as value 0 with exponent :data:`~.tile.TILE_ABSENT_EXP`: excluded terms.

Operand layout: k-major tiles ``a_pos[k, r]``, ``a_neg[k, r]``, ``a_exp[k, r]`` (int32) for the tile's rows
and ``b_pos[k, j]``, ``b_neg[k, j]``, ``b_exp[k, j]`` for its columns; the state ``c_val[r, j]`` (fp32) with
work arrays ``e_max`` (int32), ``acc_pos``, ``acc_neg`` (fp32) of the same shape.
"""

import numpy as np

from .._jit import arithmetic
from .fp32 import float32_exponent, fma_toward_zero, pow2_from_exponent, truncate_significand
from .tile import tile_decode

# Bits of the biased accumulators' significand below their leading bit (fp32: 23).
FP32_FRACTION_BITS = 23
# E is raised to at least frac - E_FLOOR_BELOW_FRAC so that B = 2**(E - frac + 23) is a normal fp32 (docstring 2).
E_FLOOR_BELOW_FRAC = 149


def biased_decline(nfma: int, frac: int, frac_out: int, late_c: int):
    """Why the biased formulation does not compute a preset (None if it does): docstring conditions 1-3."""
    if late_c:
        return "computes the early-accumulator presets (hopper, ada) only, this preset adds c late"
    if nfma * 2 ** (frac + 2) + 2 ** (frac + 1) > 2**FP32_FRACTION_BITS:
        return (f"sums a block in the 24-bit significand of an fp32 accumulator, the preset's block sums "
                f"(nfma={nfma}, frac={frac}) need more bits")
    if frac > 40 or not 0 <= frac_out <= FP32_FRACTION_BITS:
        return f"needs frac <= 40 and frac_out <= 23 (frac={frac}, frac_out={frac_out})"
    return None


@arithmetic
def biased_exponent_max(a_exp, b_exp, k, r0, j0, e_max):
    """b.1 step 2 at one k for the tile: ``e_max[r, j] = max(e_max[r, j], ex(a[k, r0 + r]) + ex(b[k, j0 + j]))``."""
    rows, lanes = e_max.shape
    for r in range(rows):
        ea = a_exp[k, r0 + r]
        for j in range(lanes):
            e_max[r, j] = max(e_max[r, j], np.int32(ea + b_exp[k, j0 + j]))


@arithmetic
def biased_products(a_pos, a_neg, b_pos, b_neg, k, r0, j0, acc_pos, acc_neg):
    """b.1 step 4 at one k for the tile: each product into the accumulator of its sign, truncated onto its grid
    (module docstring: of the four fused multiply-adds per product three add +-0)."""
    rows, lanes = acc_pos.shape
    for r in range(rows):
        ap = a_pos[k, r0 + r]
        an = a_neg[k, r0 + r]
        for j in range(lanes):
            bp = b_pos[k, j0 + j]
            bn = b_neg[k, j0 + j]
            acc_pos[r, j] = fma_toward_zero(an, bn, fma_toward_zero(ap, bp, acc_pos[r, j]))
            acc_neg[r, j] = fma_toward_zero(an, bp, fma_toward_zero(ap, bn, acc_neg[r, j]))


@arithmetic
def biased_block(a_pos, a_neg, a_exp, r0, b_pos, b_neg, b_exp, j0, kb, ke, params, c_val, e_max, acc_pos, acc_neg):
    """One early-accumulator block step (b.1) over k in [kb, ke) for the tile of rows r0 ... of the A operands and
    columns j0 ... of the B operands; updates ``c_val`` in place. (Offsets rather than views: a GPU kernel then
    indexes its shared arrays directly, which keeps their loads shared-memory loads.)"""
    nfma, lshift, rshift, frac, frac_out, min_exp, late_c = params
    rows, lanes = c_val.shape
    one = np.float32(1.0)
    zero = np.float32(0.0)
    floor = np.int32(max(min_exp, frac - E_FLOOR_BELOW_FRAC))
    for r in range(rows):
        for j in range(lanes):
            e_max[r, j] = max(float32_exponent(c_val[r, j]), floor)  # the accumulator takes part in step 2
    u = np.uint64  # unsigned indices: no negative-index wrap-around code in the loops
    end = u(ke)
    k = u(kb)
    while k + u(1) < end:  # two k per pass: half the loop overhead on a GPU
        biased_exponent_max(a_exp, b_exp, k, r0, j0, e_max)
        biased_exponent_max(a_exp, b_exp, k + u(1), r0, j0, e_max)
        k += u(2)
    if k < end:
        biased_exponent_max(a_exp, b_exp, k, r0, j0, e_max)
    for r in range(rows):
        for j in range(lanes):
            bias = pow2_from_exponent(np.int32(e_max[r, j] - frac + FP32_FRACTION_BITS))
            c = c_val[r, j]
            acc_pos[r, j] = fma_toward_zero(max(c, zero), one, bias)
            acc_neg[r, j] = fma_toward_zero(min(c, zero), one, -bias)
    k = u(kb)
    while k + u(1) < end:  # two k per pass: half the loop overhead on a GPU
        biased_products(a_pos, a_neg, b_pos, b_neg, k, r0, j0, acc_pos, acc_neg)
        biased_products(a_pos, a_neg, b_pos, b_neg, k + u(1), r0, j0, acc_pos, acc_neg)
        k += u(2)
    if k < end:
        biased_products(a_pos, a_neg, b_pos, b_neg, k, r0, j0, acc_pos, acc_neg)
    for r in range(rows):
        for j in range(lanes):
            c_val[r, j] = truncate_significand(np.float32(acc_pos[r, j] + acc_neg[r, j]), frac_out + 1)


@arithmetic
def biased_decode(code, fmt):
    """``(a_pos, a_neg, exponent)`` of an FP8 code: :func:`~.tile.tile_decode` split by sign (``a_pos = max(v, 0)``,
    ``a_neg = min(v, 0)``; zero, NaN and Inf codes give (0, 0, TILE_ABSENT_EXP))."""
    value, exp = tile_decode(code, fmt)
    return max(value, np.float32(0.0)), min(value, np.float32(0.0)), np.int32(exp)

"""One block multiply-accumulate step of a preset (semantics.md b.1 and b.2).

Operands arrive decoded (:mod:`mmaemu.formats`): a finite value is ``sig * 2**(ex - mant_bits)``; zero and
non-finite codes have ``sig = 0`` and ``ex = ABSENT_EXP``. A product of codes a and b is
``q * 2**(ea + eb - ma - mb)`` with ``q = sig_a * sig_b``; its alignment exponent is the SUM ``ea + eb``.

On the grid ``u = 2**(E - frac)`` a product becomes ``trunc(q * 2**(frac - ma - mb - (E - ea - eb)))``, an
integer shift of ``|q|`` with truncation toward zero. The preset's ``frac - ma - mb`` is split into a left
shift ``lshift = max(frac - ma - mb, 0)`` and an extra right shift ``rshift = max(ma + mb - frac, 0)`` so that
the per-product shift is always rightward. Block sums are exact 64-bit integers (the Preset checks
``nfma * 2**(frac + 2) < 2**62``), so no step depends on a floating-point mode.

The accumulator of the early presets (hopper, ada) is carried as an exact pair ``(c_sig, c_exp)`` with
``c = c_sig * 2**c_exp`` and ``c_lead = floor(log2|c|)`` (:data:`NO_LEAD` for c = 0).
"""

from ..base._jit import arithmetic
from .intbits import MAX_SHIFT, bit_length, shift_toward_zero

# floor(log2|c|) of a zero accumulator: below every exponent sum, even of two ABSENT_EXP codes.
NO_LEAD = -(1 << 22)
# Any block maximum below this comes from absent (zero or non-finite) terms only: a product with an absent
# factor has an exponent sum <= ABSENT_EXP + 15 = -16369, a real term >= -160.
ABSENT_BELOW = -(1 << 13)
# Result grid floor: a block result is never finer than 2**(-126 - frac_out) (semantics.md b.1 step 6).
RESULT_EXP_FLOOR = -126


@arithmetic
def block_max_exponent(sa, ea, sb, eb, k0, k1, c_lead):
    """E before clamping: the largest exponent sum of the block's products, and c_lead (early presets)."""
    e_max = c_lead
    for k in range(k0, k1):
        e_max = max(e_max, ea[k] + eb[k])
    return e_max


@arithmetic
def block_sum(sa, ea, sb, eb, k0, k1, e_block, lshift, rshift):
    """Sum over the block of every product truncated toward zero onto the grid 2**(E - frac) (step 4)."""
    total = 0
    for k in range(k0, k1):
        q = sa[k] * sb[k]
        shift = min(e_block - (ea[k] + eb[k]) + rshift, MAX_SHIFT)
        t = (abs(q) << lshift) >> shift
        total += t if q >= 0 else -t
    return total


@arithmetic
def normalize(total, grid_exp, frac_out):
    """Truncate ``total * 2**grid_exp`` toward zero to frac_out fraction bits (b.1 step 6).

    Returns ``(sig, exp, lead)`` with value ``sig * 2**exp`` and ``lead = floor(log2|value|)``; a zero result
    is +0 (``sig = 0``, ``lead = NO_LEAD``), never -0 (b.1 step 5).
    """
    if total == 0:
        return 0, 0, NO_LEAD
    lead = grid_exp + bit_length(abs(total)) - 1
    drop = max(lead, RESULT_EXP_FLOOR) - frac_out - grid_exp
    if drop <= 0:
        return total, grid_exp, lead
    sig = shift_toward_zero(total, -drop)
    if sig == 0:
        return 0, 0, NO_LEAD
    return sig, grid_exp + drop, lead


@arithmetic
def block_step_early(sa, ea, sb, eb, k0, k1, c_sig, c_exp, c_lead, lshift, rshift, frac, frac_out, min_exp):
    """hopper/ada block: the accumulator takes part in the alignment and is truncated like a product (b.1)."""
    e_max = block_max_exponent(sa, ea, sb, eb, k0, k1, c_lead)
    if e_max < ABSENT_BELOW:
        return 0, 0, NO_LEAD
    e_block = max(e_max, min_exp)
    grid_exp = e_block - frac
    total = block_sum(sa, ea, sb, eb, k0, k1, e_block, lshift, rshift)
    total += shift_toward_zero(c_sig, c_exp - grid_exp)
    return normalize(total, grid_exp, frac_out)


@arithmetic
def block_products_late(sa, ea, sb, eb, k0, k1, lshift, rshift, frac, frac_out, min_exp):
    """b200_mma_sync block before the late add of c: aligned over the products only (b.2 steps 1-3), which is the
    early block step with an absent accumulator (no lead, so it neither sets the block's exponent nor adds bits)."""
    return block_step_early(sa, ea, sb, eb, k0, k1, 0, 0, NO_LEAD, lshift, rshift, frac, frac_out, min_exp)

"""Blackwell block-scaled instructions: one instruction from an fp32 accumulator (semantics.md b.5).

Two algorithms, after MMA-Sim 2.1.1's models (``mmasim/arithmetic/fdpa.py``: ``st_fdpa`` and ``gst_fdpa``), which
the test suite checks bit for bit; no hardware recording is available to this project (experimental).

* **Scaled block** (``kind::mxf8f6f4``, 32 products per instruction, one UE8M0 scale per operand): the preset's
  block step of :mod:`mmaemu.arith.block` with each product's exponent ``ea + eb + e(sa) + e(sb)``: the scales move
  the products against c *before* the alignment and truncation. The caller adds the scale exponents to the
  operands' exponent arrays (:func:`block_scaled_instruction` takes them so).
* **Scaled groups** (``kind::mxf4nvf4`` / ``kind::mxf4``, 64 FP4 products per instruction): each group of
  ``group`` consecutive products is summed exactly, multiplied by the product of its two scales (UE8M0 or UE4M3,
  one per ``block`` elements of K), and the groups are fused with c: every term is truncated toward zero onto the
  grid 2**(E - frac) below the largest term exponent E (a group's exponent is its scales' exponent sum, not the
  exponent of its value), summed exactly, and the sum truncated toward zero to fp32. A group whose products are
  all zero, or whose scale is zero, takes the exponent ``min_exp``; a group that cancels to zero keeps its scales'
  exponent.

In both, a nonzero accumulator takes part in the alignment with the exponent of its fp32 normalisation, which is
-126 for a subnormal c (MMA-Sim's ``frexp_and_normalize``), and a zero accumulator with ``min_exp``. A result at
or above 2**128 is infinite (the fp32 conversion of MMA-Sim's exact sum). Non-finite inputs, accumulators and NaN
scales are the caller's (:mod:`mmaemu.model.instruction`).
"""

import math

import numpy as np

from .._jit import arithmetic
from .block import NO_LEAD, block_step_early, normalize
from .chain import exact_to_float32
from .intbits import shift_toward_zero

# fp32's minimum normal exponent: the alignment exponent of a subnormal accumulator.
FP32_MIN_EXP = -126


@arithmetic
def accumulator_parts(c):
    """(sig, exp, lead) of a finite fp32 value c = sig * 2**exp, lead its alignment exponent: floor(log2|c|), at
    least -126 (a subnormal c aligns at fp32's minimum exponent), NO_LEAD for c = 0."""
    if c == 0:
        return 0, 0, NO_LEAD
    mant, exp2 = math.frexp(np.float64(c))
    sig = np.int64(mant * 16777216.0)  # exact: an fp32 significand has 24 bits
    return sig, exp2 - 24, max(exp2 - 1, FP32_MIN_EXP)


@arithmetic
def block_scaled_instruction(sa, ea, sb, eb, k0, k1, c, lshift, rshift, frac, frac_out, min_exp):
    """One scaled-block instruction over k in [k0, k1) from the fp32 accumulator c; ``ea``/``eb`` already hold
    each element's exponent plus its block scale's exponent. Returns the fp32 result (c unchanged if not
    finite: the caller's)."""
    if not math.isfinite(c):
        return c
    c_sig, c_exp, c_lead = accumulator_parts(c)
    sig, exp, _ = block_step_early(sa, ea, sb, eb, k0, k1, c_sig, c_exp, c_lead, lshift, rshift, frac, frac_out,
                                      min_exp)
    return exact_to_float32(sig, exp)


@arithmetic
def group_exact_sum(sa, ea, sb, eb, k0, k1, e_floor):
    """(exact integer sum of the products a[k] * b[k], k in [k0, k1), on the grid 2**(e_floor - ma - mb), whether
    every product is zero). ``e_floor`` is the smallest exponent sum of two nonzero elements."""
    total = 0
    all_zero = True
    for k in range(k0, k1):
        q = sa[k] * sb[k]
        if q != 0:
            all_zero = False
            total += q << (ea[k] + eb[k] - e_floor)
    return total, all_zero


@arithmetic
def group_scaled_instruction(sa, ea, sb, eb, k0, k1, group, block, ssa, sea, ssb, seb, c, e_floor, lift, frac,
                             frac_out, min_exp):
    """One scaled-groups instruction over k in [k0, k1) from the fp32 accumulator c.

    ``ssa``/``sea`` (``ssb``/``seb``): integer significands and exponents of a's (b's) scales, one per ``block``
    elements of K (value = sig * 2**(exp - scale mantissa bits)). A group's value is ``total * ssa * ssb *
    2**(sea + seb + e_floor - lift)`` with ``lift`` = the operands' and the two scales' mantissa bits.
    """
    if not math.isfinite(c):
        return c
    c_sig, c_exp, c_lead = accumulator_parts(c)
    e_block = max(c_lead, min_exp)
    for g0 in range(k0, k1, group):
        s = g0 // block
        total, all_zero = group_exact_sum(sa, ea, sb, eb, g0, min(g0 + group, k1), e_floor)
        if not all_zero and ssa[s] * ssb[s] != 0:
            e_block = max(e_block, sea[s] + seb[s])
    grid_exp = e_block - frac
    acc = shift_toward_zero(c_sig, c_exp - grid_exp)
    for g0 in range(k0, k1, group):
        s = g0 // block
        total, all_zero = group_exact_sum(sa, ea, sb, eb, g0, min(g0 + group, k1), e_floor)
        scaled = total * ssa[s] * ssb[s]
        acc += shift_toward_zero(scaled, sea[s] + seb[s] + e_floor - lift - grid_exp)
    sig, exp, _ = normalize(acc, grid_exp, frac_out)
    return exact_to_float32(sig, exp)

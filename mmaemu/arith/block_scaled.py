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
from typing import NamedTuple

import numpy as np

from .. import formats
from ..base._jit import arithmetic, arithmetic_inlined
from .block import NO_LEAD, RESULT_EXP_FLOOR, block_step_early, normalize
from .chain import exact_to_float32
from .intbits import shift_toward_zero
from .scaled import float64_bits, float64_from_bits
from .tile import (EMAX_NONE, K_UNROLL, lane_cap, lane_shift_toward_zero, panel_value, pow2_scale, tile_exponent_max,
                   tile_normalize, tile_product_sum)

# fp32's minimum normal exponent: the alignment exponent of a subnormal accumulator.
FP32_MIN_EXP = -126


class GroupParams(NamedTuple):
    """A scaled-groups preset (``kind::mxf4nvf4``) for one pair of operand formats and a scale format, as the
    compiled arithmetic reads it: integers, built by :func:`group_params`."""

    group: int  # products summed exactly per group
    e_floor: int  # smallest exponent sum of two nonzero elements: the grid of a group's exact sum is 2**(e_floor - ma - mb)
    lift: int  # the operands' and the two scales' mantissa bits: a group's value is total * ssa * ssb * 2**(... - lift)
    frac: int  # fraction bits of the instruction's alignment grid
    frac_out: int  # fraction bits kept of the result
    min_exp: int  # floor of the alignment exponent


def group_params(preset, fmt_a: str, fmt_b: str, scale_fmt: str) -> GroupParams:
    """The :class:`GroupParams` of a scaled-groups preset, a format pair and a scale format."""
    return GroupParams(preset.group, formats.EMIN[fmt_a] + formats.EMIN[fmt_b],
                       formats.MANT_BITS[fmt_a] + formats.MANT_BITS[fmt_b] + 2 * formats.SCALE_MANT_BITS[scale_fmt],
                       preset.frac, preset.frac_out, preset.min_exp)


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
def group_scaled_instruction(sa, ea, sb, eb, k0, k1, block, ssa, sea, ssb, seb, c, gp):
    """One scaled-groups instruction over k in [k0, k1) from the fp32 accumulator c (``gp``: :class:`GroupParams`).

    ``ssa``/``sea`` (``ssb``/``seb``): integer significands and exponents of a's (b's) scales, one per ``block``
    elements of K (value = sig * 2**(exp - scale mantissa bits)). A group's value is ``total * ssa * ssb *
    2**(sea + seb + e_floor - lift)`` with ``lift`` = the operands' and the two scales' mantissa bits.
    """
    if not math.isfinite(c):
        return c
    group, e_floor, lift, frac, frac_out, min_exp = gp.group, gp.e_floor, gp.lift, gp.frac, gp.frac_out, gp.min_exp
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


# ----------------------------------------------------------------------------------------------------------------
# GEMM chains: one chain of instructions per output (semantics.md b.5), the reference of every engine


@arithmetic
def instruction_ieee_sum(va, vb, sva, svb, k0, k1, block):
    """The float64 sum of the scaled products ``va[k] * vb[k] * (sva[s] * svb[s])``, k in [k0, k1), s = k // block:
    what an instruction that holds a NaN/Inf element or a NaN scale adds to its accumulator (NaN, or an infinity:
    every finite term is far below float64's range, so the order of the sum does not matter)."""
    total = 0.0
    for k in range(k0, k1):
        s = k // block
        total += (va[k] * vb[k]) * (sva[s] * svb[s])
    return total


@arithmetic
def scaled_instruction(sa, ea, sb, eb, ssa, sea, ssb, seb, k0, k1, block, c, params, gp):
    """One instruction of the preset over k in [k0, k1) from c: scaled groups when ``gp.group`` (``gp``:
    :class:`GroupParams`), else a scaled block (``params``: :class:`~mmaemu.arith.params.BlockParams`; ``ea``/``eb``
    then hold each element's exponent plus its block scale's exponent and the scale arrays are unused)."""
    if gp.group:
        return group_scaled_instruction(sa, ea, sb, eb, k0, k1, block, ssa, sea, ssb, seb, c, gp)
    return block_scaled_instruction(sa, ea, sb, eb, k0, k1, c, params.lshift, params.rshift, params.frac,
                                    params.frac_out, params.min_exp)


@arithmetic
def scaled_chain(sa, ea, sb, eb, va, vb, ssa, sea, ssb, seb, sva, svb, bad_a, bad_b, k, block, params, gp):
    """The fp32 result of one output's chain of the preset's instructions of ``k`` elements from +0
    (:func:`scaled_instruction`).

    ``va``/``vb`` (float64 element values, NaN/Inf included) and ``sva``/``svb`` (float64 scale values, one per
    ``block``) serve the instructions flagged in ``bad_a``/``bad_b`` (one flag per instruction: a NaN/Inf element or
    a NaN scale), which add their IEEE sum (:func:`instruction_ieee_sum`) to the accumulator in float64, rounded to
    fp32.
    """
    acc = np.float32(0.0)
    for i in range(sa.shape[0] // k):
        if bad_a[i] or bad_b[i]:
            acc = np.float32(np.float64(acc) + instruction_ieee_sum(va, vb, sva, svb, i * k, (i + 1) * k, block))
        else:
            acc = scaled_instruction(sa, ea, sb, eb, ssa, sea, ssb, seb, i * k, (i + 1) * k, block, acc, params, gp)
    return acc


# ----------------------------------------------------------------------------------------------------------------
# The fast formulation of a scaled-block chain for a tile of outputs (the CPU fast path)
#
# The tile layout of :mod:`mmaemu.arith.tile` (fp32 element values, int8 exponents; SCALED_ABSENT_EXP for zero and
# non-finite codes) with, per output, the sum ``s`` of its two block scales' exponents. In units of the unscaled
# products the instruction is the f8f6f4 block step: with E = max(alignment exponent of c, largest exponent sum
# of a real product + s, min_exp), a product's term is ``trunc(a * b * 2**(frac - E + s))`` and c's term
# ``trunc(c / 2**(E - frac))``. Exactness follows mmaemu.arith.tile's proof (1)-(4) in the unscaled units: a
# nonzero product has an unscaled exponent sum >= -28 and E - s >= that sum, so frac - E + s <= frac + 28 < 91; when
# frac - E + s < -33 every product (below 2**32) truncates to 0, as with the clamped multiplier. The block maximum
# of the products is taken apart from c, in int8 (SCALED_ABSENT_EXP below: products with an absent factor have
# sums <= -49, below SCALED_REAL_PRODUCT_FROM and every real product's), so only real products raise E. c is
# carried exactly as its value, an fp32 value held in a float64 (c_val: tile_normalize_value), where the tile
# engine carries (c_sig, c_lead): its lead is its float64 exponent field and its alignment exponent max(lead,
# -126), as MMA-Sim's normalisation of a subnormal accumulator. A result at or above 2**128 (lead >= 128) is
# infinite: the output is flagged and recomputed by the reference chain, as are outputs with a NaN/Inf element or
# a NaN scale.

# Rows of A of a whole tile (mmaemu.cpu.block_scaled.TILE_ROWS), read together against each value of the panel.
ROWS = 4
# The block-scaled tile layout gives zero and non-finite codes the exponent SCALED_ABSENT_EXP instead of the tile
# layout's TILE_ABSENT_EXP (-100), so that every exponent sum of two codes fits an int8 and the products'
# exponent maxima run in int8 lanes (64 per AVX-512 vector, twice the int16 lanes): element exponents lie in
# [-14, 15] (e5m2 the widest), so real products have unscaled sums in [-28, 30], products with one absent factor
# sums in [-78, -49] and with two -128. SCALED_REAL_PRODUCT_FROM lies between: only real products raise E.
SCALED_ABSENT_EXP = -64
SCALED_REAL_PRODUCT_FROM = -40
# The int8 maximum of no product yet (below every exponent sum).
SCALED_TOP_NONE = -128
# The leading exponent of a result that fp32 cannot hold.
OVERFLOW_LEAD = 128


# Product terms of a scaled block are below 2**(frac + 2) (mmaemu.arith.tile (3)): with frac <= NARROW_FRAC_MAX a
# term fits an int32, and a run of 2**(NARROW_FRAC_MAX - frac) terms sums exactly in an int32 (below 2**31), so
# the int64 lanes of these presets (frac = 25: runs of 16) add their products in int32 lanes, twice as many per
# vector, and widen once per run.
NARROW_FRAC_MAX = 29


def narrow_run(preset) -> int:
    """Products per int32 run of :func:`tile_product_sum_narrow` for a scaled-block preset (a power of two, at
    most the instruction's k), 0 when a product term may not fit an int32."""
    if preset.frac > NARROW_FRAC_MAX:
        return 0
    return min(preset.nfma, 1 << (NARROW_FRAC_MAX - preset.frac))


@arithmetic_inlined
def tile_product_sum_narrow(a_val, b_val, kb, ke, scale, total, run, part):
    """:func:`mmaemu.arith.tile.tile_product_sum` for one row with the terms added in int32 runs of ``run``
    products (:func:`narrow_run`; ``part``: int32 work array [lanes], the lane type of each run's sum) and each
    run's sum added to ``total``: the same integers, exact by the bound above (every partial sum of a run is
    bounded by the run's sum of magnitudes)."""
    T = total.dtype.type
    lanes = total.shape[0]
    for k0 in range(kb, ke, run):
        for j in range(lanes):
            part[j] = np.int32(0)
        tile_product_sum(a_val, b_val, k0, min(k0 + run, ke), scale, part)
        for j in range(lanes):
            total[j] = T(total[j] + T(part[j]))


@arithmetic_inlined
def four_rows(a, k):
    """Element k of the tile's :data:`ROWS` rows of ``a`` [ROWS, K]."""
    return a[0, k], a[1, k], a[2, k], a[3, k]


@arithmetic_inlined
def four_rows_of(a):
    """The tile's :data:`ROWS` rows of ``a`` [ROWS, lanes] (views)."""
    return a[0], a[1], a[2], a[3]


@arithmetic_inlined
def tile_exponent_max_rows(a_exp, b_exp, kb, ke, top):
    """:func:`mmaemu.arith.tile.tile_exponent_max` for the tile's :data:`ROWS` rows at once, in int8 (``top``
    [ROWS, lanes]; exponents of the block-scaled layout, whose sums fit an int8: SCALED_ABSENT_EXP): each exponent
    of the panel read once for the four rows, four k per pass (one load and store of the maxima per pass, not per
    k); the same maxima."""
    lanes = top.shape[1]
    m0, m1, m2, m3 = four_rows_of(top)
    i8 = np.int8
    u = np.uint64
    k, end = u(kb), u(ke)
    while k + u(K_UNROLL) <= end:
        k1, k2, k3 = k + u(1), k + u(2), k + u(3)
        x0, x1, x2, x3 = four_rows(a_exp, k)
        y0, y1, y2, y3 = four_rows(a_exp, k1)
        z0, z1, z2, z3 = four_rows(a_exp, k2)
        w0, w1, w2, w3 = four_rows(a_exp, k3)
        for j in range(lanes):
            b0, b1, b2, b3 = b_exp[k, j], b_exp[k1, j], b_exp[k2, j], b_exp[k3, j]
            m0[j] = max(m0[j], max(max(i8(x0 + b0), i8(y0 + b1)), max(i8(z0 + b2), i8(w0 + b3))))
            m1[j] = max(m1[j], max(max(i8(x1 + b0), i8(y1 + b1)), max(i8(z1 + b2), i8(w1 + b3))))
            m2[j] = max(m2[j], max(max(i8(x2 + b0), i8(y2 + b1)), max(i8(z2 + b2), i8(w2 + b3))))
            m3[j] = max(m3[j], max(max(i8(x3 + b0), i8(y3 + b1)), max(i8(z3 + b2), i8(w3 + b3))))
        k += u(K_UNROLL)
    while k < end:
        x0, x1, x2, x3 = four_rows(a_exp, k)
        for j in range(lanes):
            b = b_exp[k, j]
            m0[j] = max(m0[j], i8(x0 + b))
            m1[j] = max(m1[j], i8(x1 + b))
            m2[j] = max(m2[j], i8(x2 + b))
            m3[j] = max(m3[j], i8(x3 + b))
        k += u(1)


@arithmetic_inlined
def tile_product_sum_rows(a_val, b_val, kb, ke, scale, part):
    """:func:`mmaemu.arith.tile.tile_product_sum` for the tile's :data:`ROWS` rows at once (``part``
    [ROWS, lanes]): each value of the panel read once for the four rows, two k per pass; the same integers."""
    T = part.dtype.type
    lanes = part.shape[1]
    (t0, t1, t2, t3), (p0, p1, p2, p3) = four_rows_of(part), four_rows_of(scale)
    u = np.uint64
    k, end = u(kb), u(ke)
    while k + u(2) <= end:
        k1 = k + u(1)
        (x0, x1, x2, x3), (y0, y1, y2, y3) = four_rows(a_val, k), four_rows(a_val, k1)
        for j in range(lanes):
            b0 = panel_value(b_val[k, j])
            b1 = panel_value(b_val[k1, j])
            s0, s1, s2, s3 = p0[j], p1[j], p2[j], p3[j]
            t0[j] = T(t0[j] + T(T((x0 * s0) * b0) + T((y0 * s0) * b1)))
            t1[j] = T(t1[j] + T(T((x1 * s1) * b0) + T((y1 * s1) * b1)))
            t2[j] = T(t2[j] + T(T((x2 * s2) * b0) + T((y2 * s2) * b1)))
            t3[j] = T(t3[j] + T(T((x3 * s3) * b0) + T((y3 * s3) * b1)))
        k += u(2)
    while k < end:
        x0, x1, x2, x3 = four_rows(a_val, k)
        for j in range(lanes):
            b0 = panel_value(b_val[k, j])
            t0[j] = T(t0[j] + T((x0 * p0[j]) * b0))
            t1[j] = T(t1[j] + T((x1 * p1[j]) * b0))
            t2[j] = T(t2[j] + T((x2 * p2[j]) * b0))
            t3[j] = T(t3[j] + T((x3 * p3[j]) * b0))
        k += u(1)


@arithmetic_inlined
def tile_scaled_block(a_val, a_exp, b_val, b_exp, a_sexp, b_sexp, rows, s, kb, ke, params, run, work, c_val, top,
                      part, overflow):
    """One scaled-block instruction (k in [kb, ke), scale block s) for the tile: updates the accumulators' values
    ``c_val`` (float64 [tile rows, lanes], each an fp32 value: :func:`tile_normalize_value`) in place.

    ``a_sexp[r, s]``/``b_sexp[s, j]``: the scale exponents of row r of A and lane j of the panel of B for the
    instruction; ``work`` = (c_sig, c_lead, e_max, scale, total) as in :func:`mmaemu.arith.tile.tile_accumulate`;
    ``top`` int8 [tile rows, lanes]: the products' unscaled exponent maxima;
    ``run``/``part``: :func:`tile_product_sum_narrow` (``run`` 0: the products summed in the lane type; ``part``
    int32 [tile rows, lanes]); ``overflow[r, j]`` is set when a result reaches 2**128. A tile of :data:`ROWS` rows
    reads each exponent and value of the panel once for its four rows (:func:`tile_exponent_max_rows`,
    :func:`tile_product_sum_rows`), a smaller one row by row: the same integers.
    """
    _c_sig, _c_lead, e_max, scale, total = work
    lanes = total.shape[1]
    whole = rows == ROWS
    for r in range(rows):
        for j in range(lanes):
            top[r, j] = SCALED_TOP_NONE
        if not whole:
            tile_exponent_max(a_exp[r], b_exp, kb, ke, top[r])
    if whole:
        tile_exponent_max_rows(a_exp, b_exp, kb, ke, top)
    for r in range(rows):
        scaled_block_start(a_sexp, b_sexp, r, s, params, work, c_val, top)
    if whole:
        if run:
            T = total.dtype.type
            for k0 in range(kb, ke, run):
                part[:, :] = np.int32(0)
                tile_product_sum_rows(a_val, b_val, k0, min(k0 + run, ke), scale, part)
                for r in range(ROWS):
                    for j in range(lanes):
                        total[r, j] = T(total[r, j] + T(part[r, j]))
        else:
            tile_product_sum_rows(a_val, b_val, kb, ke, scale, total)
    for r in range(rows):
        if not whole:
            if run:
                tile_product_sum_narrow(a_val[r], b_val, kb, ke, scale[r], total[r], run, part[r])
            else:
                tile_product_sum(a_val[r], b_val, kb, ke, scale[r], total[r])
        tile_normalize_value(total, e_max, r, params.frac, params.frac_out, c_val, overflow)


@arithmetic_inlined
def scaled_block_start(a_sexp, b_sexp, r, s, params, work, c_val, top):
    """Row r of a scaled-block instruction's start, from the products' unscaled exponent maxima in ``top[r]`` and
    the accumulators' values ``c_val[r]`` (float64, :func:`tile_normalize_value`): per lane the alignment exponent
    E (into ``e_max[r]``), the products' multiplier (``scale[r]``) and c's term ``trunc(c * 2**(frac - E))``
    (``total[r]``: an exact float64 product, below 2**(frac + 1) as c < 2**(lead + 1) <= 2**E, truncated by the
    conversion; E - frac lies far inside float64's normal exponents), where the int64 shift of c_sig ran before."""
    frac, min_exp = params.frac, params.min_exp
    _c_sig, _c_lead, e_max, scale, total = work
    T = total.dtype.type
    for j in range(total.shape[1]):
        sum_exp = np.int32(a_sexp[r, s] + b_sexp[s, j])
        c = c_val[r, j]
        c_align = max(float64_lead(c), FP32_MIN_EXP) if c != 0 else np.int32(EMAX_NONE)
        most = np.int32(top[r, j])
        e_prod = most + sum_exp if most >= SCALED_REAL_PRODUCT_FROM else np.int32(EMAX_NONE)
        e = np.int32(max(max(c_align, e_prod), min_exp))
        e_max[r, j] = e
        scale[r, j] = pow2_scale(np.int32(frac - e + sum_exp))
        total[r, j] = T(c * pow2_float64(np.int32(frac - e)))


@arithmetic_inlined
def float64_lead(x):
    """floor(log2|x|) of a nonzero normal float64 x: its unbiased exponent field (-1023 for 0)."""
    return np.int32(np.int32((float64_bits(x) >> np.int64(52)) & np.int64(0x7FF)) - np.int32(1023))


@arithmetic_inlined
def pow2_float64(n):
    """2**n as float64 from its bits, for n clamped to [-1022, 1023] (the normal exponents; the callers' n lie
    within a few hundred of 0)."""
    x = np.int64(min(max(n, np.int32(-1022)), np.int32(1023))) + np.int64(1023)
    return float64_from_bits(np.int64(x << np.int64(52)))


@arithmetic_inlined
def tile_normalize_value(total, e_max, r, frac, frac_out, c_val, overflow):
    """:func:`mmaemu.arith.tile.tile_normalize` for row r with the result kept as its value (float64 ``c_val``):
    the block sum ``v = total * 2**(E - frac)`` (exact: |total| < 2**53, fast_kernel's check, and E - frac a
    normal float64 exponent) truncated toward zero onto the result grid 2**(max(lead, -126) - frac_out) by
    clearing the low ``52 - frac_out + max(-126 - lead, 0)`` bits of its float64 bits (sign and magnitude: the
    magnitude's truncation); +0 where that is more than the 52 fraction bits (|v| below the grid's step, or v = 0).
    The same value as ``c_sig * 2**(max(c_lead, -126) - frac_out)`` of the integer normalisation, with the same
    lead; ``overflow[r, j]`` set where it reaches 2**128."""
    for j in range(total.shape[1]):
        v = np.float64(total[r, j]) * pow2_float64(np.int32(e_max[r, j] - frac))
        bits = float64_bits(v)
        lead = float64_lead(v)
        drop = np.int64(52 - frac_out + max(RESULT_EXP_FLOOR - lead, 0))
        kept = bits & (np.int64(-1) << min(drop, np.int64(63)))
        c_val[r, j] = float64_from_bits(kept if drop <= 52 else np.int64(0))
        overflow[r, j] |= np.uint8(lead >= OVERFLOW_LEAD)


@arithmetic_inlined
def flag_overflow(c_lead, r, overflow):
    """``overflow[r, j]`` set where row r's result has reached 2**128 (fp32 cannot hold it)."""
    for j in range(c_lead.shape[1]):
        if c_lead[r, j] >= OVERFLOW_LEAD:
            overflow[r, j] = 1


# ----------------------------------------------------------------------------------------------------------------
# The fast formulation of a scaled-groups chain (kind::mxf4nvf4) for a tile of outputs
#
# E2M1 values are multiples of 1/2 of magnitude <= 6, so a product is a multiple of 1/4 below 37 and a group sum of
# 16 products a multiple of 1/4 below 2**10: every fp32 partial sum of a group is exact (in any order), and so is
# its product with the two scales' integer significands (at most 4 bits each): at most 20 significant bits. A
# group's term trunc(G * SA * SB / 2**(E - frac)) is that fp32 value times the power of two
# 2**(ea_s + eb_s - 2 m_s - E + frac) (m_s: the scales' mantissa bits), exact while the multiplier lies in
# [2**-33, 2**91] (pow2_scale): a group that sets E has ea_s + eb_s <= E, so the exponent is at most frac; below
# 2**-33 every group value (< 2**20) truncates to 0, as with the clamped multiplier. Terms are below 2**(frac + 20)
# and four of them with c's fit int64 lanes. A group takes part in the alignment when one of its products is
# nonzero (the nonzero masks of its row's and its lane's elements share a bit: GroupMasks) and its scale product
# is not 0, exactly the reference's rule.


@arithmetic_inlined
def tile_group_sums(a_row, b_val, g0, group, gsum_g):
    """``gsum_g[j]``: the sum of the group's products a[k] * b[k, j], k in [g0, g0 + group), exact in fp32 in any
    order (see above); four k per pass of the lane loop."""
    lanes = gsum_g.shape[0]
    for j in range(lanes):
        gsum_g[j] = np.float32(0.0)
    u = np.uint64
    k = u(g0)
    end = u(g0 + group)
    while k + u(K_UNROLL) <= end:
        k1 = k + u(1)
        k2 = k + u(2)
        k3 = k + u(3)
        a0 = a_row[k]
        a1 = a_row[k1]
        a2 = a_row[k2]
        a3 = a_row[k3]
        for j in range(lanes):
            gsum_g[j] += (a0 * b_val[k, j] + a1 * b_val[k1, j]) + (a2 * b_val[k2, j] + a3 * b_val[k3, j])
        k += u(K_UNROLL)
    while k < end:
        a0 = a_row[k]
        for j in range(lanes):
            gsum_g[j] += a0 * b_val[k, j]
        k += u(1)


@arithmetic_inlined
def tile_group_sums_rows(a_val, b_val, g0, group, gsum_g):
    """:func:`tile_group_sums` for the tile's :data:`ROWS` rows at once (``gsum_g`` [ROWS, lanes]): each value of
    the panel read once for the four rows, two k per pass; the same sums (exact in any order)."""
    lanes = gsum_g.shape[1]
    gsum_g[:, :] = np.float32(0.0)
    u = np.uint64
    k, end = u(g0), u(g0 + group)
    while k + u(2) <= end:
        k1 = k + u(1)
        (x0, x1, x2, x3), (y0, y1, y2, y3) = four_rows(a_val, k), four_rows(a_val, k1)
        for j in range(lanes):
            b0 = b_val[k, j]
            b1 = b_val[k1, j]
            gsum_g[0, j] += x0 * b0 + y0 * b1
            gsum_g[1, j] += x1 * b0 + y1 * b1
            gsum_g[2, j] += x2 * b0 + y2 * b1
            gsum_g[3, j] += x3 * b0 + y3 * b1
        k += u(2)
    while k < end:
        x0, x1, x2, x3 = four_rows(a_val, k)
        for j in range(lanes):
            b0 = b_val[k, j]
            gsum_g[0, j] += x0 * b0
            gsum_g[1, j] += x1 * b0
            gsum_g[2, j] += x2 * b0
            gsum_g[3, j] += x3 * b0
        k += u(1)


@arithmetic
def row_group_masks(a_val, rows, group, masks):
    """``masks[r, g]`` (int32): bit t set where element g * group + t of row r of ``a_val`` [rows, K] is nonzero,
    for the groups g of K (group <= 32). A product is nonzero exactly where both its elements are (E2M1 values
    are at least 1/2 in magnitude), so a group of the tile holds a nonzero product exactly where the masks of
    its row and lane share a bit: :func:`tile_scaled_groups` reads that instead of a sum of the products'
    magnitudes."""
    for r in range(rows):
        for g in range(masks.shape[1]):
            m = np.int32(0)
            for t in range(group):
                m |= np.int32(a_val[r, g * group + t] != 0) << np.int32(t)
            masks[r, g] = m


@arithmetic
def panel_group_masks(b_val, group, masks):
    """``masks[g, j]`` (int32): bit t set where element g * group + t of lane j of the panel ``b_val`` [K, lanes]
    is nonzero (:func:`row_group_masks` for B; once per panel)."""
    lanes = masks.shape[1]
    for g in range(masks.shape[0]):
        for j in range(lanes):
            masks[g, j] = np.int32(0)
        for t in range(group):
            k = g * group + t
            bit = np.int32(1) << np.int32(t)
            for j in range(lanes):
                masks[g, j] |= bit if b_val[k, j] != 0 else np.int32(0)


class GroupMasks(NamedTuple):
    """The nonzero masks of a tile's groups (:func:`row_group_masks`): ``a`` [rows, K / group] of the tile's rows
    of A, ``b`` [K / group, lanes] of the panel of B."""

    a: object
    b: object


@arithmetic_inlined
def tile_scaled_groups(a_val, b_val, a_ssig, a_sexp, b_ssig, b_sexp, rows, kb, ke, block, scale_bits, gp, work,
                       gsum, masks, overflow):
    """One scaled-groups instruction over k in [kb, ke) for the tile: updates (c_sig, c_lead) in place.

    ``a_ssig[r, s]``/``a_sexp[r, s]`` (``b_ssig[s, j]``/``b_sexp[s, j]``): the integer significand (float32) and
    exponent of the scale of block s of row r of A (lane j of the panel of B); ``scale_bits`` = twice the scales'
    mantissa bits; ``gsum`` [groups, tile rows, lanes] float32 work array; ``masks``: :class:`GroupMasks` (whether
    a group holds a nonzero product); ``gp``: :class:`GroupParams`. A tile of :data:`ROWS` rows sums its groups for
    the four rows at once (:func:`tile_group_sums_rows`).
    """
    group, frac, frac_out, min_exp = gp.group, gp.frac, gp.frac_out, gp.min_exp
    c_sig, c_lead, e_max, scale, total = work
    T = total.dtype.type
    cap = lane_cap(T)
    lanes = total.shape[1]
    groups = (ke - kb) // group
    whole = rows == ROWS
    if whole:
        for g in range(groups):
            tile_group_sums_rows(a_val, b_val, kb + g * group, group, gsum[g])
    for r in range(rows):
        for j in range(lanes):
            c_align = max(c_lead[r, j], FP32_MIN_EXP) if c_sig[r, j] != 0 else np.int32(EMAX_NONE)
            e_max[r, j] = max(c_align, min_exp)
        for g in range(groups):
            g0 = kb + g * group
            if not whole:
                tile_group_sums(a_val[r], b_val, g0, group, gsum[g, r])
            s, m = g0 // block, g0 // group
            a_mask = masks.a[r, m]
            for j in range(lanes):
                counted = ((a_mask & masks.b[m, j]) != 0) & (a_ssig[r, s] * b_ssig[s, j] != 0)
                e = max(np.int32(e_max[r, j]), np.int32(a_sexp[r, s] + b_sexp[s, j]))
                e_max[r, j] = e if counted else e_max[r, j]
        for j in range(lanes):
            shift = np.int32(max(c_lead[r, j], RESULT_EXP_FLOOR) - frac_out - e_max[r, j] + frac)
            total[r, j] = lane_shift_toward_zero(c_sig[r, j], shift, T, cap)
        for g in range(groups):
            s = (kb + g * group) // block
            for j in range(lanes):
                n = np.int32(a_sexp[r, s] + b_sexp[s, j] - scale_bits - e_max[r, j] + frac)
                v = gsum[g, r, j] * (a_ssig[r, s] * b_ssig[s, j]) * pow2_scale(n)
                total[r, j] = T(total[r, j] + T(v))
        tile_normalize(total, e_max, r, frac, frac_out, c_sig, c_lead)
        flag_overflow(c_lead, r, overflow)


class TileScales(NamedTuple):
    """The scales of a tile's chains: ``a_sig``/``a_exp`` [rows, K / block] (float32 integer significand, int32
    exponent) of the tile's rows of A, ``b_sig``/``b_exp`` [K / block, lanes] of the panel of B, the block length
    and ``bits`` = twice the scales' mantissa bits (the scaled-block path reads the exponents only)."""

    a_sig: object
    a_exp: object
    b_sig: object
    b_exp: object
    block: int
    bits: int


@arithmetic
def tile_scaled_chain(a_val, a_exp, b_val, b_exp, scales, rows, K, k, params, gp, run, work, c_val, top, part,
                      gsum, masks, overflow, result):
    """``result[r, j]``: the fp32 value of the chain of the preset's instructions of ``k`` elements from +0 over
    all of K for the tile (exact where ``overflow`` stays 0): scaled groups (:func:`tile_scaled_groups`) when
    ``gp.group``, else scaled blocks (:func:`tile_scaled_block`, ``run``/``part`` its int32 runs, ``c_val``
    float64 [tile rows, lanes] its accumulators' values)."""
    frac_out = params.frac_out
    c_sig, c_lead, e_max, scale, total = work
    lanes = total.shape[1]
    for r in range(rows):
        for j in range(lanes):
            c_sig[r, j] = 0
            c_lead[r, j] = NO_LEAD
            c_val[r, j] = 0.0
            overflow[r, j] = 0
    for i in range(K // k):
        if gp.group:
            tile_scaled_groups(a_val, b_val, scales.a_sig, scales.a_exp, scales.b_sig, scales.b_exp, rows, i * k,
                               (i + 1) * k, scales.block, scales.bits, gp, work, gsum, masks, overflow)
        else:
            tile_scaled_block(a_val, a_exp, b_val, b_exp, scales.a_exp, scales.b_exp, rows, (i * k) // scales.block,
                              i * k, (i + 1) * k, params, run, work, c_val, top, part, overflow)
    for r in range(rows):
        for j in range(lanes):
            if gp.group:
                result[r, j] = exact_to_float32(c_sig[r, j], max(c_lead[r, j], RESULT_EXP_FLOOR) - frac_out)
            else:
                result[r, j] = np.float32(c_val[r, j])  # an fp32 value (exact_to_float32's conversion)

"""The early-accumulator block step (semantics.md b.1) with one offset fp32 accumulator per output: each product one
fused multiply-add rounding toward zero, plus an exact count of the products it floors one unit too far. The
formulation of the ``cuda:offset`` kernel (design note: shared/design/gpu-kernels.md, section 2).

For one output and one block with alignment exponent E (b.1 step 2) and grid ``u = 2**(E - frac)``:

* **Offset.** ``f = E - frac + 23`` and ``M = 1.5 * 2**f``: fp32 numbers in ``[2**f, 2**(f+1))`` are the integer
  multiples of u. The block starts at ``S = M + trunc(c / u) * u``, c the accumulator.
* **Products.** ``S = fma_toward_zero(a, b, S)`` (:func:`~.fp32.fma_toward_zero`) for every k. While S and the
  exact ``S + a*b`` stay in that binade, rounding toward zero of a positive number onto the multiples of u is the
  floor: ``S + floor(a*b / u) * u``. For ``a*b >= 0``, and for a negative multiple of u, floor is the truncation
  toward zero that b.1 step 4 asks for; a negative product that is not a multiple of u is floored one unit too far.
* **Count.** So the block sum is ``S - M + n * u``, n the number of negative products that are not multiples of u.
  ``|a| = odd * 2**la`` (la: the exponent of the lowest set bit), so ``a*b`` is a multiple of u iff
  ``la + lb >= E - frac``. Each operand element carries a *low byte* ``la - la_min`` (:data:`ZERO_LOW` for zero,
  NaN and Inf codes) and a *sign byte* (:data:`SIGN_BYTE` for negative values, 0 otherwise), four k per word.
  Per output and block, the *threshold byte* is ``T = THRESHOLD_TOP - clamp(E - frac - lo, 0, R + 1)`` with
  ``lo = la_min_a + la_min_b`` and R the sum of the two formats' low-byte ranges. Then for each k the byte
  ``low_a + low_b + T`` has bit 7 set iff the product is exact (a multiple of u, or a zero term),
  ``~(low_a + low_b + T) & (sign_a ^ sign_b)`` keeps bit 7 exactly for the products to correct, and
  :func:`~.packed.dp4a` with 0x01010101 adds 128 per such product to a per-output count. At the block end
  ``count / 128`` is added to S's bit pattern (an integer add on an fp32 pattern inside one binade adds units of
  its ulp, u), and ``d = S - M`` is the block sum, exact.
* **Exponent pass.** E4M3 x E4M3 (from sm_80) by bf16 *power sums* (:mod:`.power_sums`, conditions 10-13): one
  ``fma.rn.bf16x2`` per product and two outputs, an fp32 pattern ``P`` in the binade of ``2**E_prod`` per output.
  Other pairs by *add-max*: each element carries an *exponent half* ``ex + EXP_BIAS`` (:data:`EXP_ABSENT` for
  zero, NaN and Inf codes), two k per word; :func:`~.packed.add_u16x2` of an A word and a B word gives two exponent
  sums and :func:`~.packed.max_u16x2` keeps the running maxima of even and odd k per output (on sm_90 the pair is
  one ``VIADDMNMX.U16x2``). At the block start :func:`~.packed.swap_halves` and one more maximum put the block's
  largest sum ``s`` in the low half, and ``P = s * 2**23 + P_SHIFT`` (32-bit arithmetic: only the low 9 bits of
  s reach the exponent field and the sign bit) is the fp32 pattern of ``2**E_prod`` (condition 9). Either way E is
  the exponent field of ``max(P, 2**e_floor, |c|)`` (fp32 maxima; :func:`offset_start`), ``e_floor = max(min_exp,
  lo)``: the block exponent of b.1 step 2 raised to lo (condition 2).
* **Deferred truncation.** b.1 step 6 (truncation of the block result to frac_out + 1 significant bits) is applied
  once, at the end of a chain (:func:`offset_chain_value`), not after every block: the next block truncates its
  accumulator toward zero onto ``2**(E' - frac)`` with ``E' >= lead(d)``, and when ``frac_out >= frac`` that grid
  is a multiple of ``2**(lead(d) - frac_out)``, so truncating onto the coarser grid alone gives the same value
  (nested truncations toward zero onto power-of-two grids compose; the leading bit, and so E', is unchanged).

Exactness conditions (checked by :func:`offset_decline` and :func:`offset_params`, proven here; each is tested on
both sides of its bound in ``tests/test_offset.py``):

1. *S stays in its binade.* In units of u: the accumulator's term ``|trunc(c/u)| < 2**(frac+1)`` (c below
   ``2**(E+1)``), each floored product ``|floor(p/u)| <= 2**(frac+2)`` (p below ``2**(E+2)``), each correction
   at most 1 per product; every partial sum is therefore within
   ``W = nfma * 2**(frac+2) + 2**(frac+1)`` of M, and so is every exact ``S + p`` before rounding. With
   ``W <= 2**22`` (the window; hopper and ada fit), ``M - W >= 2**f`` and ``M + W < 2**(f+1)``.
2. *M is a normal fp32.* ``E >= e_floor >= lo >= -32`` and frac <= 40 give ``f >= -72``; the top is ``f <= 127``
   for any K below 2**60. Raising E to ``lo`` changes nothing: every nonzero term is a multiple of
   ``2**lo`` (products, and so the accumulators built from them), so its exponent is at least lo.
3. *Start without loss.* ``trunc(c/u) * u = fma_toward_zero(c, 1, sM) - sM`` with ``sM = copysign(M, c)``:
   ``|c| < 2**22 * u`` keeps ``c + sM`` in sM's binade, where rounding toward zero truncates |c|; both the
   subtraction and ``M + trunc(c/u) * u`` are exact (Sterbenz; a multiple of u inside the binade).
4. *Bytes never carry.* Low bytes lie in ``[0, r]`` (r = 17 for E4M3, 31 for E5M2), zero codes read ZERO_LOW, T in
   ``[THRESHOLD_TOP - R - 1, THRESHOLD_TOP]``: every byte sum is at most ``2 * ZERO_LOW + THRESHOLD_TOP`` = 254
   < 256, so no carry reaches the next k's byte, and bit 7 is set iff ``low_a + low_b >= clamp(...)``. (From
   ZERO_LOW = 65 up, two zero terms under a threshold near 128 carry into the next byte and flip its test.)
5. *Zero terms never count.* Their sign byte is 0 and their low byte ``ZERO_LOW >= R + 1`` (63 for E5M2 x E5M2)
   reads exact whatever T is; with the clamp, thresholds at or below 0 mean "always exact", above R "never".
6. *Exponent words stay in the domain of the stand-ins below sm_90* (:mod:`.packed`): halves are at most
   ``EXP_BIAS + 15``, so no half-sum reaches 2**16 (the 32-bit add carries nothing); sums of two halves lie in
   ``[2 * EXP_ABSENT, 2 * (EXP_BIAS + 15)]`` = [0x0500, 0x061E], positive normal fp16 patterns (the fp16
   maximum is the unsigned one); a sum with an absent half is below every real exponent sum
   (``EXP_ABSENT + EXP_BIAS + 15 < 2 * (EXP_BIAS - 14)``), so absent terms never win against a real product.
7. *The count fits.* At most nfma products per block, ``128 * nfma < 2**32``; the pattern add stays in the binade
   because the corrected sum is the block sum, bounded by 1.
8. *Deferral* needs ``frac_out >= frac`` (see above). A zero block sum gives ``S - M = +0`` (b.1 step 5); the chain
   value is the pattern with its low ``23 - frac_out`` bits cleared (:func:`~.fp32.truncate_significand`): every
   nonzero value is at least ``2**-72``, normal.
9. *The exponent pattern.* ``s * 2**23`` keeps ``s mod 512`` in bits 23-31, and ``P_SHIFT = (127 - 2 * EXP_BIAS)
   mod 512`` in the same bits makes them ``(s - 2 * EXP_BIAS + 127) mod 512``. For a real sum ``s = 2 * EXP_BIAS +
   e``, e in [-28, 30], that is ``e + 127`` in [99, 157]: sign bit clear, P = the pattern of 2**e. With no real
   product in the block, s is ``EXP_ABSENT + EXP_BIAS + ex`` (ex in [-14, 15]) or ``2 * EXP_ABSENT``, and the
   field is ``(ex - 1) mod 512`` or 383 (EXP_ABSENT = EXP_BIAS - 128): either the sign bit is set (a negative
   int32) or the field is at most 14, below the floor's ``e_floor + 127 >= 95``; so such a P never sets E.
   (With EXP_ABSENT = EXP_BIAS - 256, two absent halves read as E = 0.) As an fp32 number such a P is negative (a
   normal number or, with field 511, -Inf: its low 23 bits are 0, never a NaN), so the fp32 maximum passes over it;
   among positive fp32 numbers, and +0, the maximum is the largest pattern. |c| is finite; c = +-0 and subnormal c
   read an exponent field of 0, below the floor (subnormal c are below ``2**lo``, which condition 2 makes
   irrelevant).
10-13. The power sums: :mod:`.power_sums`.
14. *Power sums need no lower clamp of the threshold.* Their tables give zero codes the low byte
   :data:`POWER_ZERO_LOW` = 35 = R + 1 (E4M3 x E4M3: R = 34), which reads exact at the upper clamp (condition 5),
   and the shift ``E - frac - lo`` goes below 0 only down to ``e_floor - frac - lo >= -frac >= -15`` (condition 1
   with nfma >= 16 gives frac <= 15): T at most 143, two zero terms sum to at most ``70 + 143 < 256`` (no carry),
   and a T above 128 sets bit 7 for every product (all exact, as they are when ``E - frac <= lo``). One
   instruction less per output and block; E5M2 pairs need ``ZERO_LOW >= 63``, whose two zero terms would carry.

Operand layout of a staged block (k-major; ``r0``/``j0`` are the tile's first row of A / column of B, multiples of
4, as are the tile's rows and columns): ``*_val[k, row]`` fp32 values (0 for zero, NaN and Inf codes),
``*_exp[k // 2, row]`` uint32 exponent words (add-max: the row's halves of two k; power sums, *paired*: the powers
of rows ``row - row % 2`` and ``row - row % 2 + 1`` at ``k = 2 * (k // 2) + row % 2``), ``*_bytes[k // 4, 2 *
row]`` the low-byte word and ``*_bytes[k // 4, 2 * row + 1]`` the sign-byte word of four k (interleaved, so that a
tile's rows read both with vector loads and a stage copies one array); a block starts at a multiple of 16 and whole
words are read, 16 k per pass (elements past K are zero codes). :func:`offset_tables` gives the per-code values
and :func:`offset_pack` packs four k of a row.
"""

from typing import NamedTuple

import numpy as np

from .. import formats
from ..base._jit import arithmetic
from .fp32 import FP32_EXPONENT_BIAS, FP32_FRACTION_BITS, fma_toward_zero, truncate_significand
from .packed import BYTE_ONES, add_u16x2, dp4a, load_words4, max_u16x2, swap_halves
from .offset_step import correction_flags, step_end, step_scalars, step_start
from .params import BlockParams
from .power_sums import (POWER_FORMATS, POWER_START, POWER_TERMS, power_add, power_bits, power_exponent_pass,
                         power_product_bits)

EXP_BIAS = 0x0300  # exponent half of a finite nonzero element: ex + EXP_BIAS (ex in [-14, 15])
EXP_ABSENT = EXP_BIAS - 128  # exponent half of zero, NaN and Inf codes (conditions 6, 9)
ZERO_LOW = 63  # low byte of zero, NaN and Inf codes (conditions 4, 5)
POWER_ZERO_LOW = 35  # the same in the power-sum tables (E4M3 x E4M3, no lower clamp: condition 14)
SIGN_BYTE = 0x80  # sign byte of a negative value
THRESHOLD_TOP = 128  # T for "every product exact" (bit 7 of a byte)
OFFSET_MANTISSA = 0x400000  # M = 1.5 * 2**f: the middle of its binade (condition 1)
EXPONENT_FIELD = 0xFF800000  # sign and exponent bits of an fp32 pattern
WINDOW = 2**22  # half the width of M's binade, in units of u (condition 1)
K_GROUP = 4  # k per byte word
K_PASS = 16  # blocks start on multiples of this many k and are read as whole passes of it
EXPONENT_PASS_WORDS = 4  # exponent words per pass of offset_exponent_pass (the first pass is outside its loop)
PRODUCT_PASS_GROUPS = 4  # 4-k groups per pass of offset_products
ADD_MAX, POWER_SUMS = "add-max", "power sums"  # the two exponent passes (module docstring)


class OffsetConstants(NamedTuple):
    """The offset block step's constants for one preset, format pair and exponent pass (int32 values, built by
    :func:`offset_params`; module docstring)."""

    nfma: int  # products per block
    frac_out: int  # fraction bits kept of a chain's result (deferred truncation, condition 8)
    p_add: int  # P_SHIFT of condition 9 (add-max), or the power sums' ``(127 - q0) * 2**23`` (condition 13)
    floor_bits: int  # the fp32 pattern of 2**e_floor, e_floor = max(min_exp, lo)
    m_add: int  # M's pattern is ``E_field * 2**23 + m_add`` (E_field = E + 127)
    tau_add: int  # the threshold's shift is clamp(E_field + tau_add, 0, tau_max) (power sums: no lower clamp)
    tau_max: int
    top4: int  # THRESHOLD_TOP in each byte (T in each byte is ``top4 - shift * 0x01010101``)
    mantissa: int  # OFFSET_MANTISSA, M's mantissa field
    start: int  # POWER_START in both halves (the power sums' first word)


def format_low_range(fmt):
    """(la_min, r): the lowest-set-bit exponent of the format's smallest subnormal and the range of the low bytes
    ``la - la_min`` of its finite nonzero values (semantics.md (a): E4M3 2**-9 ... 2**8, E5M2 2**-16 ... 2**15)."""
    mbits = formats.MANT_BITS[fmt]
    emin = formats.EMIN[fmt]
    emax = {"e4m3": 8, "e5m2": 15}[fmt]
    return emin - mbits, emax - (emin - mbits)


def offset_decline(nfma: int, frac: int, frac_out: int, late_c: int):
    """Why the offset formulation does not compute a preset (None if it does): conditions 1, 2 and 8, and the
    word layout (blocks of whole 4-k groups)."""
    if late_c:
        return "computes the early-accumulator presets (hopper, ada) only, this preset adds c late"
    if nfma * 2 ** (frac + 2) + 2 ** (frac + 1) > WINDOW:
        return (f"sums a block inside one binade of an fp32 accumulator (2**22 units either side), the preset's "
                f"block sums (nfma={nfma}, frac={frac}) need more")
    if frac_out < frac:
        return (f"truncates block results once per chain, which needs frac_out >= frac "
                f"(frac={frac}, frac_out={frac_out})")
    if frac > 40 or frac_out > FP32_FRACTION_BITS:
        return f"needs frac <= 40 and frac_out <= 23 (frac={frac}, frac_out={frac_out})"
    if nfma % K_PASS:
        return f"reads blocks {K_PASS} k at a time, which nfma={nfma} is not a multiple of"
    return None


def offset_floor_decline(min_exp: int, frac: int):
    """Why the offset formulation does not compute a preset's min_exp (None if it does): condition 2's top.
    ``E >= min_exp`` puts M at ``2**f``, ``f = E - frac + 23``, which must stay a finite fp32 (``f <= 127``);
    products and accumulators alone keep E below 93 (K below 2**60), so only a min_exp above ``frac + 104``
    breaks it (a custom preset: the shipped ones have min_exp below 0)."""
    if min_exp - frac + FP32_FRACTION_BITS > 127:
        return (f"places its offset at 2**(E - frac + 23), which overflows fp32 for min_exp={min_exp} > "
                f"frac + 104 = {frac + 104}")
    return None


def offset_preset_decline(params):
    """Why the offset formulation does not compute a preset's block parameters (:class:`~.params.BlockParams`),
    None if it does: :func:`offset_decline` and :func:`offset_floor_decline`, the one rule that the CPU's offset
    engine and the CUDA offset kernel both start from."""
    params = BlockParams(*(int(v) for v in params))
    return (offset_decline(params.nfma, params.frac, params.frac_out, params.late_c)
            or offset_floor_decline(params.min_exp, params.frac))


def exponent_method(fmt_a: str, fmt_b: str, nfma: int) -> str:
    """The exponent pass of a format pair and block length: POWER_SUMS for E4M3 x E4M3 blocks of at most
    POWER_TERMS products (conditions 10-11), ADD_MAX otherwise."""
    return POWER_SUMS if (fmt_a, fmt_b) == POWER_FORMATS and nfma <= POWER_TERMS else ADD_MAX


def offset_params(params, fmt_a: str, fmt_b: str, method: str = ADD_MAX) -> OffsetConstants:
    """The block step's :class:`OffsetConstants` for a preset's block parameters
    (:class:`~.params.BlockParams`), a format pair and an exponent pass (module docstring; power sums:
    ``min(E_field + tau_add, tau_max)``, condition 14)."""
    params = BlockParams(*(int(v) for v in params))
    nfma, frac, frac_out = params.nfma, params.frac, params.frac_out
    la_a, ra = format_low_range(fmt_a)
    la_b, rb = format_low_range(fmt_b)
    lo = la_a + la_b
    e_floor = max(params.min_exp, lo)
    bias = FP32_EXPONENT_BIAS
    if method == POWER_SUMS:
        if exponent_method(fmt_a, fmt_b, nfma) != POWER_SUMS:
            raise ValueError(f"power sums compute E4M3 x E4M3 blocks of at most {POWER_TERMS} products, not "
                             f"{fmt_a} x {fmt_b} with nfma={nfma}")
        p_add = power_add()
    else:
        p_add = ((bias - 2 * EXP_BIAS) % 512) << FP32_FRACTION_BITS
    m_add = ((FP32_FRACTION_BITS - frac) << FP32_FRACTION_BITS) + OFFSET_MANTISSA
    return OffsetConstants(*(int(np.array(v % 2**32, np.uint32).view(np.int32)) for v in (
        nfma, frac_out, p_add, (e_floor + bias) << FP32_FRACTION_BITS, m_add, -(bias + frac + lo), ra + rb + 1,
        THRESHOLD_TOP * BYTE_ONES, OFFSET_MANTISSA, POWER_START * 0x00010001)))


def offset_tables(fmt: str, method: str = ADD_MAX):
    """(values float32[256], exponents uint32[256], low bytes uint32[256], sign bytes uint32[256]) of the codes of
    a format (module docstring); exponents are the exponent halves (add-max) or the bf16 powers (power sums) of the
    codes; zero, NaN and Inf codes are absent terms."""
    values = np.array(formats.values(fmt), np.float64)
    exps = np.array(formats.exponents(fmt), np.int64)
    sigs = np.array(formats.significands(fmt), np.int64)
    finite = np.isfinite(values) & (values != 0)
    la_min, _ = format_low_range(fmt)
    mbits = formats.MANT_BITS[fmt]
    magnitude = np.abs(sigs)
    trailing = np.zeros(256, np.int64)
    for bit in range(1, mbits + 2):  # trailing zero bits of the significand (at most mbits + 1 bits)
        trailing += (finite & (magnitude % (1 << bit) == 0)).astype(np.int64)
    low = exps - mbits + trailing - la_min
    if method == POWER_SUMS:
        if fmt != POWER_FORMATS[0]:
            raise ValueError(f"power sums take {POWER_FORMATS[0]} operands, not {fmt}")
        exponent_words = np.where(finite, power_bits(np.where(finite, exps, 0)), 0)
    else:
        exponent_words = np.where(finite, exps + EXP_BIAS, EXP_ABSENT)
    return (np.where(finite, values, 0.0).astype(np.float32), exponent_words.astype(np.uint32),
            np.where(finite, low, POWER_ZERO_LOW if method == POWER_SUMS else ZERO_LOW).astype(np.uint32),
            np.where(finite & (values < 0), SIGN_BYTE, 0).astype(np.uint32))


EXPONENT_BYTE_ABSENT = -100  # exponent byte of zero, NaN and Inf codes (the byte exponent pass, below)


def exponent_bytes(fmt: str) -> np.ndarray:
    """int8[256]: the alignment exponent ``ex`` of each code of a format (semantics.md (a); E4M3 -6 ... 8, E5M2
    -14 ... 15), :data:`EXPONENT_BYTE_ABSENT` for zero, NaN and Inf codes: the operands of the *byte exponent
    pass*, b.1 steps 1-2 on signed bytes with saturating sums (the CPU's offset engine, 64 outputs per
    instruction). Why it gives E_prod: two real exponents sum to ``[-28, 30]``, inside int8; a sum with an absent
    term is at most ``-100 + 15 = -85`` (or saturates at -128), so the maximum over a block is the largest real
    exponent sum where the block has a product, and otherwise at most -85. The fp32 pattern ``(s + 127) * 2**23``
    of such a maximum s is 2**s for a real sum, a positive number below 2**-84 (under the floor 2**e_floor, e_floor
    >= lo >= -32, condition 2) for -85 ... -100 and, for -128, 0xFF800000 (-Inf): the fp32 maximum of
    :func:`offset_start` passes over both, as over condition 9's patterns of absent sums."""
    exps = np.array(formats.exponents(fmt), np.int64)
    values = np.array(formats.values(fmt), np.float64)
    finite = np.isfinite(values) & (values != 0)
    return np.where(finite, exps, EXPONENT_BYTE_ABSENT).astype(np.int8)


@arithmetic
def code_at(codes, row, k):
    """The code at (row, k), or the zero code past the rows or past K."""
    if row < codes.shape[0] and k < codes.shape[1]:
        return np.uint8(codes[row, k])
    return np.uint8(0)


@arithmetic
def exponent_word(codes, row, k, exps):
    """Exponents (halves or powers) of the codes at (row, k) and (row, k + 1) in the low and high half."""
    return np.uint32(exps[code_at(codes, row, k)] | (exps[code_at(codes, row, k + 1)] << 16))


@arithmetic
def paired_word(codes, row, k, exps):
    """Powers of the codes at (row, k) and (row + 1, k) in the low and high half."""
    return np.uint32(exps[code_at(codes, row, k)] | (exps[code_at(codes, row + 1, k)] << 16))


@arithmetic
def offset_pack(codes, row, k4, tables, odd, paired):
    """Four k of a row of codes (k = 4 * k4 ...; zero codes past the rows or past K) in the staged layout:
    ``(v0, v1, v2, v3, exp_lo, exp_hi, low, sign)``, values fp32 and words uint32. The exponent words hold the
    row's halves of k = 4 * k4, 4 * k4 + 1 and of 4 * k4 + 2, 4 * k4 + 3 (add-max), or, ``paired``, the powers of
    rows ``row - odd`` and ``row - odd + 1`` at k = 4 * k4 + odd and at 4 * k4 + 2 + odd (``odd``: the parity of
    the row's column in the staged arrays)."""
    values, exps, lows, signs = tables
    k = 4 * k4
    c0, c1 = code_at(codes, row, k), code_at(codes, row, k + 1)
    c2, c3 = code_at(codes, row, k + 2), code_at(codes, row, k + 3)
    low = np.uint32(lows[c0] | (lows[c1] << 8) | (lows[c2] << 16) | (lows[c3] << 24))
    sign = np.uint32(signs[c0] | (signs[c1] << 8) | (signs[c2] << 16) | (signs[c3] << 24))
    if paired:
        e_lo, e_hi = paired_word(codes, row - odd, k + odd, exps), paired_word(codes, row - odd, k + 2 + odd, exps)
    else:
        e_lo, e_hi = exponent_word(codes, row, k, exps), exponent_word(codes, row, k + 2, exps)
    return values[c0], values[c1], values[c2], values[c3], e_lo, e_hi, low, sign


@arithmetic
def add_max_word(a_exp, r0, b_exp, j0, w, e_pair, first):
    """Word w (k = 2w, 2w + 1) into the exponent maxima of the tile: ``e_pair[r, j]`` = the per-half maxima of
    ``a_exp[w, r0 + r] + b_exp[w, j0 + j]`` and, unless ``first``, its value before."""
    rows, lanes = e_pair.shape
    u = np.uint32
    for r in range(0, rows, 4):
        a = load_words4(a_exp, w, r0 + u(r))
        for j in range(0, lanes, 4):
            b = load_words4(b_exp, w, j0 + u(j))
            for i in range(4):
                for c in range(4):
                    sums = add_u16x2(a[i], b[c])
                    e_pair[r + i, j + c] = sums if first else max_u16x2(e_pair[r + i, j + c], sums)


@arithmetic
def offset_exponent_pass(a_exp, r0, b_exp, j0, w0, w1, e_pair):
    """b.1 steps 1-2 over the exponent words w in [w0, w1) (a multiple of 4, at least 4): ``e_pair[r, j]`` =
    per-half maxima of ``a_exp[w, r0 + r] + b_exp[w, j0 + j]`` (the first word writes it: nothing is read on
    entry); four words per pass; rows, lanes, r0 and j0 multiples of 4."""
    u = np.uint32
    add_max_word(a_exp, r0, b_exp, j0, w0, e_pair, True)
    add_max_word(a_exp, r0, b_exp, j0, u(w0 + u(1)), e_pair, False)
    add_max_word(a_exp, r0, b_exp, j0, u(w0 + u(2)), e_pair, False)
    add_max_word(a_exp, r0, b_exp, j0, u(w0 + u(3)), e_pair, False)
    w = u(w0 + u(4))
    while w < w1:
        add_max_word(a_exp, r0, b_exp, j0, w, e_pair, False)
        add_max_word(a_exp, r0, b_exp, j0, u(w + u(1)), e_pair, False)
        add_max_word(a_exp, r0, b_exp, j0, u(w + u(2)), e_pair, False)
        add_max_word(a_exp, r0, b_exp, j0, u(w + u(3)), e_pair, False)
        w = u(w + u(4))


@arithmetic
def offset_start(constants, product_bits, c, clamp_low):
    """b.1 steps 2-3 and the accumulator's term of step 4 for one output: E from ``product_bits`` (the int32
    pattern of 2**E_prod, or a pattern below the floor's when the block has no product), c and the floor; returns
    the offset sum ``M + trunc(c / u) * u`` and the threshold word (four copies of T). ``clamp_low``: clamp the
    threshold's shift at 0 (the power sums' tables do without, condition 14). :func:`.offset_step.step_start` on
    scalars (the CPU's offset engine runs it on vectors)."""
    acc, thresh = step_start(np.int32(product_bits), c, step_scalars(constants), clamp_low)
    return acc, np.uint32(thresh)


@arithmetic
def offset_block_start(constants, c_val, e_pair, acc, thresh, count):
    """:func:`offset_start` for every output, E_prod from its exponent maxima ``e_pair[r, j]`` (add-max pass), and
    ``count = 0``."""
    i32, u32 = np.int32, np.uint32
    p_shift = i32(constants.p_add)
    rows, lanes = c_val.shape
    for r in range(rows):
        for j in range(lanes):
            pair = e_pair[r, j]
            largest = max_u16x2(pair, swap_halves(pair))  # the block's largest exponent sum, in both halves
            product_bits = i32(i32(largest << u32(FP32_FRACTION_BITS)) + p_shift)  # 2**E_prod (condition 9)
            acc[r, j], thresh[r, j] = offset_start(constants, product_bits, c_val[r, j], True)
            count[r, j] = u32(0)


@arithmetic
def power_block_start(constants, c_val, e_pair, acc, thresh, count):
    """:func:`offset_start` for every output, E_prod from the power sums ``e_pair[r // 2, j]`` (the half ``r % 2``;
    power-sum pass), and ``count = 0``."""
    add = np.int32(constants.p_add)
    rows, lanes = c_val.shape
    for r in range(rows):
        for j in range(lanes):
            product_bits = power_product_bits(e_pair[r >> 1, j], r & 1, add)
            acc[r, j], thresh[r, j] = offset_start(constants, product_bits, c_val[r, j], False)
            count[r, j] = np.uint32(0)


@arithmetic
def offset_group(a_val, a_bytes, r0, b_val, b_bytes, j0, g, acc, thresh, count):
    """Four k (group g) of :func:`offset_products`."""
    rows, lanes = acc.shape
    u = np.uint32
    k = g * u(4)
    for r in range(rows):
        low_a = u(a_bytes[g, u(2) * (r0 + u(r))])
        sign_a = u(a_bytes[g, u(2) * (r0 + u(r)) + u(1)])
        a0 = a_val[k, r0 + u(r)]
        a1 = a_val[k + u(1), r0 + u(r)]
        a2 = a_val[k + u(2), r0 + u(r)]
        a3 = a_val[k + u(3), r0 + u(r)]
        for j in range(lanes):
            s = acc[r, j]
            s = fma_toward_zero(a0, b_val[k, j0 + u(j)], s)
            s = fma_toward_zero(a1, b_val[k + u(1), j0 + u(j)], s)
            s = fma_toward_zero(a2, b_val[k + u(2), j0 + u(j)], s)
            acc[r, j] = fma_toward_zero(a3, b_val[k + u(3), j0 + u(j)], s)
            flags = u(correction_flags(low_a, u(b_bytes[g, u(2) * (j0 + u(j))]), sign_a,
                                       u(b_bytes[g, u(2) * (j0 + u(j)) + u(1)]), thresh[r, j]))
            count[r, j] = dp4a(flags, u(BYTE_ONES), count[r, j])


@arithmetic
def offset_products(a_val, a_bytes, r0, b_val, b_bytes, j0, g0, g1, acc, thresh, count):
    """b.1 step 4 over the 4-k groups g in [g0, g1) (a multiple of 4): every product into ``acc`` by one fused
    multiply-add rounding toward zero, and the count of those floored one unit too far (module docstring)."""
    u = np.uint32
    g = g0
    while g < g1:
        offset_group(a_val, a_bytes, r0, b_val, b_bytes, j0, g, acc, thresh, count)
        offset_group(a_val, a_bytes, r0, b_val, b_bytes, j0, g + u(1), acc, thresh, count)
        offset_group(a_val, a_bytes, r0, b_val, b_bytes, j0, g + u(2), acc, thresh, count)
        offset_group(a_val, a_bytes, r0, b_val, b_bytes, j0, g + u(3), acc, thresh, count)
        g += u(4)


@arithmetic
def offset_block_end(constants, acc, count, c_val):
    """The block sum ``c = S + count/128 units - M`` (exact; +0 when zero; :func:`.offset_step.step_end` on
    scalars); its truncation is deferred. M is read back from S's exponent (S stays in M's binade); its mantissa
    comes from ``constants`` (a register operand, so that one logic instruction rebuilds M)."""
    v = step_scalars(constants)
    rows, lanes = acc.shape
    for r in range(rows):
        for j in range(lanes):
            c_val[r, j] = step_end(acc[r, j], np.int32(count[r, j] >> np.uint32(7)), v)


@arithmetic
def offset_block(a_val, a_exp, a_bytes, r0, b_val, b_exp, b_bytes, j0, kb, ke, constants, c_val, work):
    """One early-accumulator block step (b.1, result truncation deferred) over k in [kb, ke) for the tile of rows
    r0 ... of A and columns j0 ... of B, E by the add-max pass; updates ``c_val`` in place. kb is a multiple of 16,
    ke > kb, and the staged operands hold zero codes from ke up to the next multiple of 16 (past K), which are read
    as whole words: the loops then have no ragged end (a block without products is :func:`offset_empty_block`).
    ``work`` = (e_pair, acc, thresh, count), arrays of the tile's shape (uint32, float32, uint32, uint32) that need
    no content on entry."""
    e_pair, acc, thresh, count = work
    first, end = block_range(kb, ke)
    offset_exponent_pass(a_exp, r0, b_exp, j0, first >> np.uint32(1), end >> np.uint32(1), e_pair)
    offset_block_start(constants, c_val, e_pair, acc, thresh, count)
    offset_products(a_val, a_bytes, r0, b_val, b_bytes, j0, first >> np.uint32(2), end >> np.uint32(2), acc, thresh,
                    count)
    offset_block_end(constants, acc, count, c_val)


@arithmetic
def power_offset_block(a_val, a_exp, a_bytes, r0, b_val, b_exp, b_bytes, j0, kb, ke, constants, c_val, work):
    """:func:`offset_block` with E by power sums (E4M3 x E4M3, paired exponent words; :mod:`.power_sums`)."""
    e_pair, acc, thresh, count = work
    first, end = block_range(kb, ke)
    power_exponent_pass(a_exp, r0, b_exp, j0, first >> np.uint32(1), end >> np.uint32(1), np.uint32(constants.start),
                        e_pair)
    power_block_start(constants, c_val, e_pair, acc, thresh, count)
    offset_products(a_val, a_bytes, r0, b_val, b_bytes, j0, first >> np.uint32(2), end >> np.uint32(2), acc, thresh,
                    count)
    offset_block_end(constants, acc, count, c_val)


@arithmetic
def block_range(kb, ke):
    """The k read for a block over [kb, ke): kb and ke rounded up to a multiple of K_PASS, uint32."""
    u = np.uint32
    return u(kb), u(u(u(ke) + u(K_PASS - 1)) & u(~(K_PASS - 1) & 0xFFFFFFFF))


@arithmetic
def offset_empty_block(constants, c_val, work):
    """A block without products (zero padding past K in a split tile): ``c_val`` truncated toward zero onto the
    grid of ``E = max(exponent of c, e_floor)``, the block step on the accumulator alone (b.1 with no term)."""
    e_pair, acc, thresh, count = work
    floor_bits = np.int32(constants.floor_bits)  # no product: E from c and the floor alone
    rows, lanes = c_val.shape
    for r in range(rows):
        for j in range(lanes):
            acc[r, j], thresh[r, j] = offset_start(constants, floor_bits, c_val[r, j], True)
            count[r, j] = np.uint32(0)
    offset_block_end(constants, acc, count, c_val)


@arithmetic
def offset_chain_value(c, frac_out):
    """The chain's fp32 result from its deferred accumulator: truncated to frac_out + 1 significant bits."""
    return truncate_significand(c, frac_out + 1)


@arithmetic
def add_chain_values(partial, c_val, frac_out):
    """``partial[r, j] += offset_chain_value(c_val[r, j])`` (fp32 RNE adds, in place): a chain that ended with the
    deferred accumulators ``c_val`` enters its split's partial (float32 arrays [rows, lanes]). The split-K skeleton
    of the offset engines (CPU and ``cuda:offset``): the partial cleared
    (:func:`mmaemu.arith.schedule.clear_tile`), then per chain of the split its block steps and this call."""
    rows, lanes = partial.shape
    for r in range(rows):
        for j in range(lanes):
            partial[r, j] = np.float32(partial[r, j] + offset_chain_value(c_val[r, j], frac_out))


@arithmetic
def offset_pack_into(codes, row, g, tables, column, val, exp, byte_words, paired):
    """Four k (group g) of row ``row`` of ``codes`` (zero codes past its rows or past K) packed into column
    ``column`` of the k-major staged arrays (:func:`offset_pack`; ``row - column`` even)."""
    v0, v1, v2, v3, e01, e23, lw, sg = offset_pack(codes, row, g, tables, column & 1, paired)
    val[4 * g, column] = v0
    val[4 * g + 1, column] = v1
    val[4 * g + 2, column] = v2
    val[4 * g + 3, column] = v3
    exp[2 * g, column] = e01
    exp[2 * g + 1, column] = e23
    byte_words[g, 2 * column] = lw
    byte_words[g, 2 * column + 1] = sg


@arithmetic
def offset_pack_rows(codes, tables, val, exp, byte_words, paired):
    """Every row of ``codes`` [rows, K] packed into k-major staged arrays (``val[Kp, rows]``, ``exp[Kp // 2, rows]``,
    ``byte_words[Kp // 4, 2 * rows]``, Kp a multiple of 4 at least K; rows and k past the codes are zero codes)."""
    for g in range(byte_words.shape[0]):
        for row in range(val.shape[1]):
            offset_pack_into(codes, row, g, tables, row, val, exp, byte_words, paired)

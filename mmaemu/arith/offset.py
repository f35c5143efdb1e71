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
* **Exponent pass.** E is the maximum of the exponent sums of the block's nonzero products and of c's exponent.
  Each element carries ``ex + EXP_BIAS`` (:data:`EXP_ABSENT` for zero, NaN and Inf codes) as a 16-bit half, two k
  per word; the sum of an A word and a B word holds two exponent sums, and :func:`~.packed.max_u16x2` keeps the
  running maxima of even and odd k per output. E is the larger half minus ``2 * EXP_BIAS``, raised to c's
  exponent (-127 for c = +0) and to ``e_floor = max(min_exp, lo)``.
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
6. *Exponent words stay in the fp16 domain of max_u16x2 below sm_90* (:mod:`.packed`): sums of two halves lie in
   ``[2 * EXP_ABSENT, 2 * (EXP_BIAS + 15)]`` = [0x0400, 0x061E], and a sum with an absent half is below every real
   exponent sum (``EXP_ABSENT + EXP_BIAS + 15 < 2 * (EXP_BIAS - 14)``), so absent terms never set E.
7. *The count fits.* At most nfma products per block, ``128 * nfma < 2**32``; the pattern add stays in the binade
   because the corrected sum is the block sum, bounded by 1.
8. *Deferral* needs ``frac_out >= frac`` (see above). A zero block sum gives ``S - M = +0`` (b.1 step 5); the chain
   value is the pattern with its low ``23 - frac_out`` bits cleared (:func:`~.fp32.truncate_significand`): every
   nonzero value is at least ``2**-72``, normal.

Operand layout of a staged block (k-major; ``r0``/``j0`` are the tile's first row of A / column of B):
``*_val[k, row]`` fp32 values (0 for zero, NaN and Inf codes), ``*_exp[k // 2, row]`` uint32 exponent words,
``*_low[k // 4, row]`` and ``*_sign[k // 4, row]`` uint32 byte words; a block starts at a multiple of 4 and whole
words are read, 8 k per pass (elements past K are zero codes). :func:`offset_tables` gives the per-code values and
:func:`offset_pack` packs four k of a row.
"""

import numpy as np

from .. import formats
from .._jit import arithmetic
from .fp32 import float32_bits, float32_exponent, float32_from_bits, fma_toward_zero, truncate_significand
from .packed import BYTE_ONES, dp4a, max_u16x2, replicate_byte

EXP_BIAS = 0x0300  # exponent half-word of a finite nonzero element: ex + EXP_BIAS (ex in [-14, 15])
EXP_ABSENT = 0x0200  # exponent half-word of zero, NaN and Inf codes (condition 6)
ZERO_LOW = 63  # low byte of zero, NaN and Inf codes (conditions 4, 5)
SIGN_BYTE = 0x80  # sign byte of a negative value
THRESHOLD_TOP = 128  # T for "every product exact" (bit 7 of a byte)
OFFSET_MANTISSA = 0x400000  # M = 1.5 * 2**f: the middle of its binade (condition 1)
FP32_FRACTION_BITS = 23
WINDOW = 2**22  # half the width of M's binade, in units of u (condition 1)
K_GROUP = 4  # k per byte word
K_PASS = 8  # k per pass of the block loops (two words of each kind); blocks start on multiples of it


def format_low_range(fmt):
    """(la_min, r): the lowest-set-bit exponent of the format's smallest subnormal and the range of the low bytes
    ``la - la_min`` of its finite nonzero values (semantics.md (a): E4M3 2**-9 ... 2**8, E5M2 2**-16 ... 2**15)."""
    mbits = formats.MANT_BITS[fmt]
    emin = {"e4m3": -6, "e5m2": -14}[fmt]
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


def offset_params(params, fmt_a: str, fmt_b: str):
    """``(nfma, frac, frac_out, e_floor, tau_base, tau_max, threshold_top, offset_mantissa)``: a preset (as
    :func:`~.params.preset_params` gives it) and a format pair as the block step takes them (``tau = E - tau_base``
    clamped to [0, tau_max]; T = top - tau)."""
    nfma, lshift, rshift, frac, frac_out, min_exp, late_c = (int(v) for v in params)
    la_a, ra = format_low_range(fmt_a)
    la_b, rb = format_low_range(fmt_b)
    lo = la_a + la_b
    return (nfma, frac, frac_out, max(min_exp, lo), frac + lo, ra + rb + 1, THRESHOLD_TOP, OFFSET_MANTISSA)


def offset_tables(fmt: str):
    """(values float32[256], exponent halves uint32[256], low bytes uint32[256], sign bytes uint32[256]) of the
    codes of a format (module docstring); zero, NaN and Inf codes are absent terms."""
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
    return (np.where(finite, values, 0.0).astype(np.float32),
            np.where(finite, exps + EXP_BIAS, EXP_ABSENT).astype(np.uint32),
            np.where(finite, low, ZERO_LOW).astype(np.uint32),
            np.where(finite & (values < 0), SIGN_BYTE, 0).astype(np.uint32))


@arithmetic
def offset_pack(codes, row, k4, tables):
    """Four k of a row of codes (k = 4 * k4 ...; zero codes past the row's end) in the staged layout:
    ``(v0, v1, v2, v3, exp01, exp23, low, sign)``, values fp32 and words uint32."""
    values, exps, lows, signs = tables
    K = codes.shape[1]
    c0 = np.uint8(codes[row, 4 * k4]) if 4 * k4 < K else np.uint8(0)
    c1 = np.uint8(codes[row, 4 * k4 + 1]) if 4 * k4 + 1 < K else np.uint8(0)
    c2 = np.uint8(codes[row, 4 * k4 + 2]) if 4 * k4 + 2 < K else np.uint8(0)
    c3 = np.uint8(codes[row, 4 * k4 + 3]) if 4 * k4 + 3 < K else np.uint8(0)
    low = np.uint32(lows[c0] | (lows[c1] << 8) | (lows[c2] << 16) | (lows[c3] << 24))
    sign = np.uint32(signs[c0] | (signs[c1] << 8) | (signs[c2] << 16) | (signs[c3] << 24))
    e = np.uint32(exps[c0] | (exps[c1] << 16))
    e_hi = np.uint32(exps[c2] | (exps[c3] << 16))
    return values[c0], values[c1], values[c2], values[c3], e, e_hi, low, sign


@arithmetic
def offset_exponent_pass(a_exp, r0, b_exp, j0, w0, w1, e_pair):
    """b.1 steps 1-2 over the exponent words w in [w0, w1) (an even count): ``e_pair[r, j]`` = per-half maxima of
    ``a_exp[w, r0 + r] + b_exp[w, j0 + j]``; two words per pass, a three-way maximum on GPUs that have one."""
    rows, lanes = e_pair.shape
    u = np.uint64
    w = u(w0)
    while w < u(w1):
        for r in range(rows):
            ea = np.uint32(a_exp[w, r0 + r])
            ea1 = np.uint32(a_exp[w + u(1), r0 + r])
            for j in range(lanes):
                first = np.uint32(ea + np.uint32(b_exp[w, j0 + j]))
                second = np.uint32(ea1 + np.uint32(b_exp[w + u(1), j0 + j]))
                e_pair[r, j] = max_u16x2(max_u16x2(e_pair[r, j], first), second)
        w += u(2)


@arithmetic
def offset_block_start(params, c_val, e_pair, acc, thresh, count):
    """b.1 steps 2-3 and the accumulator's term of step 4: E per output from its exponent maxima and c; the offset
    sum ``acc = M + trunc(c / u) * u``, the threshold word ``thresh`` (four copies of T) and ``count = 0``."""
    i32 = np.int32
    frac = i32(params[1])
    e_floor = i32(params[3])
    tau_base = i32(params[4])
    tau_max = i32(params[5])
    top = np.uint32(params[6])
    m_low = i32(params[7] + ((FP32_FRACTION_BITS + 127) << 23))  # M's pattern is (E - frac) << 23 plus this
    rows, lanes = c_val.shape
    for r in range(rows):
        for j in range(lanes):
            pair = e_pair[r, j]
            e_pair[r, j] = np.uint32(0x04000400)  # 2 * EXP_ABSENT in both halves: no term yet
            e = i32(i32(max(pair & np.uint32(0xFFFF), pair >> np.uint32(16))) - i32(2 * EXP_BIAS))
            c = c_val[r, j]
            e = max(e, float32_exponent(c), e_floor)
            m = float32_from_bits(i32(i32(i32(e - frac) << i32(23)) + m_low))
            signed_m = float32_from_bits(i32(float32_bits(m) | (float32_bits(c) & i32(-0x80000000))))
            acc[r, j] = np.float32(m + np.float32(fma_toward_zero(c, np.float32(1.0), signed_m) - signed_m))
            byte = np.uint32(top - np.uint32(min(max(i32(e - tau_base), i32(0)), tau_max)))
            thresh[r, j] = replicate_byte(byte)
            count[r, j] = np.uint32(0)


@arithmetic
def offset_group(a_val, a_low, a_sign, r0, b_val, b_low, b_sign, j0, g, acc, thresh, count):
    """Four k (group g) of :func:`offset_products`."""
    rows, lanes = acc.shape
    u = np.uint64
    k = g * u(4)
    for r in range(rows):
        low_a = np.uint32(a_low[g, r0 + r])
        sign_a = np.uint32(a_sign[g, r0 + r])
        a0 = a_val[k, r0 + r]
        a1 = a_val[k + u(1), r0 + r]
        a2 = a_val[k + u(2), r0 + r]
        a3 = a_val[k + u(3), r0 + r]
        for j in range(lanes):
            s = acc[r, j]
            s = fma_toward_zero(a0, b_val[k, j0 + j], s)
            s = fma_toward_zero(a1, b_val[k + u(1), j0 + j], s)
            s = fma_toward_zero(a2, b_val[k + u(2), j0 + j], s)
            acc[r, j] = fma_toward_zero(a3, b_val[k + u(3), j0 + j], s)
            exact = np.uint32(np.uint32(low_a + np.uint32(b_low[g, j0 + j])) + thresh[r, j])
            flags = np.uint32(~exact & np.uint32(sign_a ^ np.uint32(b_sign[g, j0 + j])))
            count[r, j] = dp4a(flags, np.uint32(BYTE_ONES), count[r, j])


@arithmetic
def offset_products(a_val, a_low, a_sign, r0, b_val, b_low, b_sign, j0, g0, g1, acc, thresh, count):
    """b.1 step 4 over the 4-k groups g in [g0, g1) (an even count): every product into ``acc`` by one fused
    multiply-add rounding toward zero, and the count of those floored one unit too far (module docstring)."""
    u = np.uint64
    g = u(g0)
    while g < u(g1):
        offset_group(a_val, a_low, a_sign, r0, b_val, b_low, b_sign, j0, g, acc, thresh, count)
        offset_group(a_val, a_low, a_sign, r0, b_val, b_low, b_sign, j0, g + u(1), acc, thresh, count)
        g += u(2)


@arithmetic
def offset_block_end(params, acc, count, c_val):
    """The block sum ``c = S + count/128 units - M`` (exact; +0 when zero); its truncation is deferred. M is read
    back from S's exponent (S stays in M's binade)."""
    offset_mantissa = np.int32(params[7])
    rows, lanes = acc.shape
    for r in range(rows):
        for j in range(lanes):
            bits = np.int32(float32_bits(acc[r, j]) + np.int32(count[r, j] >> np.uint32(7)))
            m = float32_from_bits(np.int32((bits & np.int32(-0x00800000)) | offset_mantissa))
            c_val[r, j] = np.float32(float32_from_bits(bits) - m)


@arithmetic
def offset_block(a_val, a_exp, a_low, a_sign, r0, b_val, b_exp, b_low, b_sign, j0, kb, ke, params, c_val, work):
    """One early-accumulator block step (b.1, result truncation deferred) over k in [kb, ke) for the tile of rows
    r0 ... of A and columns j0 ... of B; updates ``c_val`` in place. kb is a multiple of 8 and the staged operands
    hold zero codes from ke up to the next multiple of 8 (past K), which are read as whole words: the loops then
    have no ragged end. ``work`` = (e_pair, acc, thresh, count), arrays of the tile's shape (uint32, float32,
    uint32, uint32); ``e_pair`` must hold 0x04000400 on entry (as :func:`offset_block_start` leaves it)."""
    e_pair, acc, thresh, count = work
    span = (ke - kb + K_PASS - 1) // K_PASS * K_PASS
    offset_exponent_pass(a_exp, r0, b_exp, j0, kb // 2, (kb + span) // 2, e_pair)
    offset_block_start(params, c_val, e_pair, acc, thresh, count)
    offset_products(a_val, a_low, a_sign, r0, b_val, b_low, b_sign, j0, kb // 4, (kb + span) // 4, acc, thresh,
                    count)
    offset_block_end(params, acc, count, c_val)


@arithmetic
def offset_chain_value(c, frac_out):
    """The chain's fp32 result from its deferred accumulator: truncated to frac_out + 1 significant bits."""
    return truncate_significand(c, frac_out + 1)


@arithmetic
def offset_pack_rows(codes, tables, val, exp, low, sign):
    """Every row of ``codes`` [rows, K] packed into k-major staged arrays (``val[Kp, rows]``, ``exp[Kp // 2, rows]``,
    ``low``/``sign[Kp // 4, rows]``, Kp a multiple of 4 at least K; rows and k past the codes are zero codes)."""
    for g in range(low.shape[0]):
        for row in range(val.shape[1]):
            if row < codes.shape[0]:
                v0, v1, v2, v3, e01, e23, lw, sg = offset_pack(codes, row, g, tables)
            else:
                v0, v1, v2, v3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
                e01 = e23 = np.uint32(EXP_ABSENT | (EXP_ABSENT << 16))
                lw = np.uint32(ZERO_LOW * BYTE_ONES)
                sg = np.uint32(0)
            val[4 * g, row] = v0
            val[4 * g + 1, row] = v1
            val[4 * g + 2, row] = v2
            val[4 * g + 3, row] = v3
            exp[2 * g, row] = e01
            exp[2 * g + 1, row] = e23
            low[g, row] = lw
            sign[g, row] = sg

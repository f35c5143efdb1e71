"""Slow, exact reference ("oracle") of the mmaemu numerics contract.

Written from the specification text (semantics.md, sections a-e and f.9) alone, independently of the
fast implementation in ``mmaemu``, which it must never import.  All arithmetic uses Python integers and
``fractions.Fraction``; every rounding (fp32, bf16, fp16, E4M3, E5M2) is done here, exactly, on Fractions.
Nothing is vectorised or clever: each function is one rule of the specification, named after its section.

Conventions:

* FP8 operands are integer codes 0..255; fp32/bf16/fp16 values are integer bit patterns.
* Exact values are ``Fraction``; the non-finite values are the strings ``NAN``, ``POS_INF``, ``NEG_INF``.
* A "preset" is any object with attributes ``nfma, frac, frac_out, min_exp, late_c, slow_chunk``
  (table b); ``PRESETS`` holds the three shipped ones as simple namespaces.

Slow by design: use it on small shapes only (a 4 x 16 x 1024 GEMM takes a few tenths of a second).
"""

from fractions import Fraction
from functools import lru_cache
from math import trunc
from types import SimpleNamespace
from typing import NamedTuple

NAN = "nan"
POS_INF = "+inf"
NEG_INF = "-inf"

CANONICAL_NAN_FP32 = 0x7FFFFFFF  # c.4 / e.4: sign cleared, all mantissa bits set
CONTIGUOUS_TILE = 128  # d.1: H100 split tiles
INTERLEAVED_TILE = 64  # d.2: RTX 4060 split tiles
SPLIT_SCHEMES = ("contiguous", "serial", "pairwise")

# Table (b).  slow_chunk: restart length of unsplit slow accumulation (c.2); None = no GEMM level (b.2, b.3).
PRESETS = {
    "hopper": SimpleNamespace(name="hopper", nfma=32, frac=13, frac_out=13, min_exp=-132,
                              late_c=False, slow_chunk=128),
    "ada": SimpleNamespace(name="ada", nfma=16, frac=13, frac_out=13, min_exp=-132,
                           late_c=False, slow_chunk=128),
    "b200_mma_sync": SimpleNamespace(name="b200_mma_sync", nfma=32, frac=25, frac_out=23, min_exp=-133,
                                     late_c=True, slow_chunk=None),
}


# ---------------------------------------------------------------------------------------------------------------
# Exact helpers (conventions at the top of semantics.md)
# ---------------------------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def pow2(n: int) -> Fraction:
    """2**n as an exact Fraction (n may be negative)."""
    return Fraction(1 << n) if n >= 0 else Fraction(1, 1 << -n)


def floor_log2(x: Fraction) -> int:
    """floor(log2|x|) of a nonzero rational, computed exactly (never with a floating log2)."""
    x = abs(Fraction(x))
    num, den = x.numerator, x.denominator
    e = num.bit_length() - den.bit_length()  # 2**(e-1) < num/den < 2**(e+1)
    below = num < (den << e) if e >= 0 else (num << -e) < den
    return e - 1 if below else e


def truncate_to_grid(x: Fraction, grid: Fraction) -> Fraction:
    """'Truncate x to the grid g' = g * trunc(x / g): toward zero, symmetric for negative x."""
    return grid * trunc(x / grid)


def round_half_even(q: Fraction) -> int:
    """The integer nearest to q, ties to the even integer."""
    n = q.numerator // q.denominator  # floor
    rest = q - n
    if rest != Fraction(1, 2):
        return n + 1 if rest > Fraction(1, 2) else n
    return n + (n & 1)


# ---------------------------------------------------------------------------------------------------------------
# Binary floating-point formats: decode, encode, RNE (conventions: RNE with gradual underflow)
# ---------------------------------------------------------------------------------------------------------------

class BinaryFormat(NamedTuple):
    exp_bits: int
    mant_bits: int
    has_inf: bool  # False only for E4M3 (its all-ones exponent is still finite, except mantissa all ones)
    canonical_nan: int  # e.4: the NaN pattern the contract outputs
    max_finite: Fraction

    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def emin(self) -> int:  # exponent of the smallest normal
        return 1 - self.bias

    @property
    def sign_bit(self) -> int:
        return 1 << (self.exp_bits + self.mant_bits)


def _ieee(exp_bits: int, mant_bits: int, canonical_nan: int) -> BinaryFormat:
    bias = (1 << (exp_bits - 1)) - 1
    largest = (2 - pow2(-mant_bits)) * pow2(bias)
    return BinaryFormat(exp_bits, mant_bits, True, canonical_nan, largest)


FORMATS = {
    "float32": _ieee(8, 23, 0x7FFFFFFF),
    "bfloat16": _ieee(8, 7, 0x7FFF),
    "float16": _ieee(5, 10, 0x7FFF),
    "e4m3": BinaryFormat(4, 3, False, 0x7F, Fraction(448)),
    "e5m2": _ieee(5, 2, 0x7F),
}
FORMATS["float8_e4m3fn"] = FORMATS["e4m3"]
FORMATS["float8_e5m2"] = FORMATS["e5m2"]


def value_of(bits: int, fmt: str):
    """Exact value of a bit pattern of any format in FORMATS: Fraction (both zeros give 0), NAN, POS_INF, NEG_INF."""
    f = FORMATS[fmt]
    negative = bool(bits & f.sign_bit)
    field = (bits >> f.mant_bits) & ((1 << f.exp_bits) - 1)
    mant = bits & ((1 << f.mant_bits) - 1)
    all_ones = (1 << f.exp_bits) - 1
    if field == all_ones and f.has_inf:
        if mant:
            return NAN
        return NEG_INF if negative else POS_INF
    if field == all_ones and mant == (1 << f.mant_bits) - 1:  # E4M3: only s.1111.111 is NaN
        return NAN
    if field == 0:
        magnitude = mant * pow2(f.emin - f.mant_bits)  # subnormal (or zero)
    else:
        magnitude = ((1 << f.mant_bits) + mant) * pow2(field - f.bias - f.mant_bits)
    return -magnitude if negative else magnitude


def is_negative(bits: int, fmt: str) -> bool:
    """The sign bit of a pattern (meaningful for zeros and infinities too)."""
    return bool(bits & FORMATS[fmt].sign_bit)


def encode(magnitude: Fraction, fmt: str, negative: bool) -> int:
    """Bit pattern of an exactly representable finite magnitude (>= 0) with the given sign."""
    f = FORMATS[fmt]
    sign = f.sign_bit if negative else 0
    if magnitude == 0:
        return sign
    if magnitude < pow2(f.emin):
        field, scaled = 0, magnitude / pow2(f.emin - f.mant_bits)
    else:
        e = floor_log2(magnitude)
        field, scaled = e + f.bias, magnitude / pow2(e - f.mant_bits) - (1 << f.mant_bits)
    if scaled.denominator != 1 or magnitude > f.max_finite:
        raise ValueError(f"{magnitude} is not representable in {fmt}")
    return sign | (field << f.mant_bits) | int(scaled)


def rne_magnitude(magnitude: Fraction, fmt: str) -> Fraction:
    """RNE of a positive real onto the format's grid with gradual underflow and an unbounded exponent range."""
    f = FORMATS[fmt]
    e = max(floor_log2(magnitude), f.emin)  # below the smallest normal the grid stays the subnormal one
    quantum = pow2(e - f.mant_bits)
    return quantum * round_half_even(magnitude / quantum)


def round_to(x: Fraction, fmt: str, negative_zero: bool = False) -> int:
    """IEEE RNE of the exact real x into fmt (conventions 'RNE(x, fmt)'), returned as a bit pattern.

    A nonzero x keeps its sign even when it rounds to zero (a tiny negative gives -0).  An exact zero is +0
    unless negative_zero.  Overflow (the rounded magnitude exceeds the largest finite value) gives +-Inf; E4M3
    has no Inf, so there it raises OverflowError (the epilogue clamps before rounding, e.3).
    """
    f = FORMATS[fmt]
    if x == 0:
        return f.sign_bit if negative_zero else 0
    negative = x < 0
    magnitude = rne_magnitude(abs(x), fmt)
    if magnitude > f.max_finite:
        if not f.has_inf:
            raise OverflowError(f"{x} overflows {fmt}")
        return inf_bits(fmt, negative)
    return encode(magnitude, fmt, negative)


def inf_bits(fmt: str, negative: bool) -> int:
    f = FORMATS[fmt]
    return (f.sign_bit if negative else 0) | (((1 << f.exp_bits) - 1) << f.mant_bits)


def round_fp32(x: Fraction, negative_zero: bool = False) -> int:
    """RNE_fp32(x) as bits (see round_to)."""
    return round_to(x, "float32", negative_zero)


def fp32_value(bits: int):
    """Exact value of an fp32 bit pattern (Fraction, NAN, POS_INF or NEG_INF)."""
    return value_of(bits, "float32")


def special_bits(special: str, fmt: str = "float32") -> int:
    """Bits of NAN (canonical, e.4), POS_INF or NEG_INF."""
    if special == NAN:
        return FORMATS[fmt].canonical_nan
    return inf_bits(fmt, special == NEG_INF)


# ---------------------------------------------------------------------------------------------------------------
# IEEE binary32 operations with every special case (used by the epilogue, split sums, late c and dot)
# ---------------------------------------------------------------------------------------------------------------

def ieee_sum_of_specials(terms) -> str:
    """IEEE result of a sum in which at least one term is NaN or Inf: NaN wins, +Inf with -Inf is NaN."""
    if NAN in terms or (POS_INF in terms and NEG_INF in terms):
        return NAN
    return POS_INF if POS_INF in terms else NEG_INF


def ieee_product(x, y):
    """Exact IEEE product of two values (Fraction or special): Inf x 0 = NaN, NaN absorbs, signs multiply."""
    if x == NAN or y == NAN:
        return NAN
    if isinstance(x, str) or isinstance(y, str):
        if x == 0 or y == 0:
            return NAN
        negative = (x == NEG_INF or (not isinstance(x, str) and x < 0)) != \
                   (y == NEG_INF or (not isinstance(y, str) and y < 0))
        return NEG_INF if negative else POS_INF
    return x * y


def fp32_add(x_bits: int, y_bits: int) -> int:
    """One IEEE binary32 addition with RNE ('fp32 add', the operator written as a circled plus).

    The exact sum is rounded once.  An exact zero sum is +0, except (-0) + (-0) = -0.  NaN is canonical.
    """
    x, y = fp32_value(x_bits), fp32_value(y_bits)
    if isinstance(x, str) or isinstance(y, str):
        return special_bits(ieee_sum_of_specials([x, y]))
    both_negative_zero = x == 0 and y == 0 and is_negative(x_bits, "float32") and is_negative(y_bits, "float32")
    return round_fp32(x + y, negative_zero=both_negative_zero)


def fp32_mul(x_bits: int, y_bits: int) -> int:
    """One IEEE binary32 multiplication with RNE; the sign of a zero result is the XOR of the operand signs."""
    product = ieee_product(fp32_value(x_bits), fp32_value(y_bits))
    if isinstance(product, str):
        return special_bits(product)
    negative = is_negative(x_bits, "float32") != is_negative(y_bits, "float32")
    return round_fp32(product, negative_zero=negative)


def fp32_fma_plus_zero(x_bits: int, y_bits: int) -> int:
    """RNE_fp32(x * y + (+0)) as one fused multiply-add (e.2).

    An exactly-zero product gives +0 whatever the signs (-0 + +0 = +0); a nonzero product that underflows keeps
    its sign (it is rounded once, as a nonzero real); Inf x 0 and NaN give NaN.
    """
    product = ieee_product(fp32_value(x_bits), fp32_value(y_bits))
    if isinstance(product, str):
        return special_bits(product)
    return round_fp32(product)  # a zero product has no sign here: +0


# ---------------------------------------------------------------------------------------------------------------
# (a) FP8 input formats
# ---------------------------------------------------------------------------------------------------------------

FP8_EMIN = {"e4m3": -6, "e5m2": -14}  # (a): exponent of the smallest normal


@lru_cache(maxsize=None)
def decode(code: int, fmt: str):
    """(a) Value of an FP8 code: Fraction (-0 gives 0), or NAN / POS_INF / NEG_INF.  Literal tables of (a)."""
    sign = -1 if code & 0x80 else 1
    if fmt == "e4m3":  # s eeee mmm, bias 7, no infinities
        e, m = (code >> 3) & 0xF, code & 0x7
        if e == 15 and m == 7:
            return NAN
        return sign * (m * pow2(-9) if e == 0 else (8 + m) * pow2(e - 10))
    if fmt == "e5m2":  # s eeeee mm, bias 15, IEEE-like
        e, m = (code >> 2) & 0x1F, code & 0x3
        if e == 31:
            return NAN if m else (POS_INF if sign > 0 else NEG_INF)
        return sign * (m * pow2(-16) if e == 0 else (4 + m) * pow2(e - 17))
    raise ValueError(f"unknown FP8 format {fmt!r}")


def is_negative_zero(code: int, fmt: str) -> bool:
    """True for the -0 code 0x80 (both formats); it decodes to Fraction(0) like +0."""
    return code == 0x80 and fmt in FP8_EMIN


def is_finite_code(code: int, fmt: str) -> bool:
    return not isinstance(decode(code, fmt), str)


def alignment_exponent(value: Fraction, fmt: str) -> int:
    """(a) ex(v) = max(floor(log2|v|), emin) of a finite nonzero FP8 value."""
    return max(floor_log2(value), FP8_EMIN[fmt])


@lru_cache(maxsize=None)
def product_term(code_a: int, code_b: int, fmt_a: str, fmt_b: str):
    """(a) Exact product of two finite codes and its product exponent ex(a) + ex(b) (a SUM, not log2|a*b|).

    Returns None for an excluded term (a zero factor of either sign).
    """
    a, b = decode(code_a, fmt_a), decode(code_b, fmt_b)
    if isinstance(a, str) or isinstance(b, str):
        raise ValueError("block arithmetic only takes finite codes")
    if a == 0 or b == 0:
        return None
    return a * b, alignment_exponent(a, fmt_a) + alignment_exponent(b, fmt_b)


# ---------------------------------------------------------------------------------------------------------------
# (b) One block multiply-accumulate
# ---------------------------------------------------------------------------------------------------------------

def normalise_truncate(d: Fraction, frac_out: int) -> Fraction:
    """b.1 step 5-6 / b.2 step 3: truncate d toward zero to frac_out fraction bits below its leading bit,
    whose exponent is clamped below at -126.  A zero d is +0."""
    if d == 0:
        return Fraction(0)
    f = max(floor_log2(d), -126)
    return truncate_to_grid(d, pow2(f - frac_out))


def block_step(c: Fraction, pairs, fmt_a: str, fmt_b: str, preset) -> Fraction:
    """(b) One block: the nfma pairs (finite codes; fewer means zero padding) multiplied and added to c.

    b.1 for early-accumulator presets, b.2 (late c, one fp32 RNE add) when preset.late_c.
    """
    terms = [t for t in (product_term(a, b, fmt_a, fmt_b) for a, b in pairs) if t is not None]
    if preset.late_c:
        return _late_block(c, terms, preset)
    return _early_block(c, terms, preset)


def _early_block(c: Fraction, terms, preset) -> Fraction:
    """b.1: products and accumulator aligned to one exponent E, each truncated toward zero onto 2**(E-frac),
    summed exactly, then the sum truncated to frac_out fraction bits."""
    exponents = [e for _, e in terms]
    if c != 0:
        exponents.append(floor_log2(c))  # the accumulator's true exponent, no emin clamp
    if not exponents:
        return Fraction(0)  # step 2: no products and c = 0 -> +0
    big_e = max(max(exponents), preset.min_exp)
    grid = pow2(big_e - preset.frac)
    total = sum(trunc(p / grid) for p, _ in terms) + trunc(c / grid)  # step 4, exact integer
    return normalise_truncate(total * grid, preset.frac_out)  # steps 5-6


def _late_block(c: Fraction, terms, preset) -> Fraction:
    """b.2: products alone aligned (E clamped at min_exp), truncated onto 2**(E-frac), summed exactly,
    normalised to frac_out fraction bits, then ONE fp32 RNE add of c."""
    d = Fraction(0)
    if terms:
        grid = pow2(max(max(e for _, e in terms), preset.min_exp) - preset.frac)
        d = normalise_truncate(sum(truncate_to_grid(p, grid) for p, _ in terms), preset.frac_out)
    return _as_fraction(fp32_add(round_fp32(d), round_fp32(c)))


def _as_fraction(bits: int) -> Fraction:
    value = fp32_value(bits)
    if isinstance(value, str):
        raise OverflowError("a GEMM-path accumulator cannot be non-finite")
    return value


# ---------------------------------------------------------------------------------------------------------------
# (c) Chains and the unsplit GEMM accumulation
# ---------------------------------------------------------------------------------------------------------------

def chain(pairs, fmt_a: str, fmt_b: str, preset) -> Fraction:
    """(c) One chain from c = +0 over the pairs in order, nfma at a time.

    The last block may be short: that is the zero padding of c.1 (zero pairs are excluded terms).
    """
    c = Fraction(0)
    for start in range(0, len(pairs), preset.nfma):
        c = block_step(c, pairs[start:start + preset.nfma], fmt_a, fmt_b, preset)
    return c


def fp32_add_values(x: Fraction, y: Fraction) -> Fraction:
    """x (+) y for finite GEMM-path values (never -0 there, c.3)."""
    return _as_fraction(fp32_add(round_fp32(x), round_fp32(y)))


def fp32_sum(values) -> Fraction:
    """acc = +0; acc = acc (+) v for each v in order (c.2, d.1 step 3, d.2 step 4)."""
    acc = Fraction(0)
    for v in values:
        acc = fp32_add_values(acc, v)
    return acc


def unsplit(pairs, fmt_a, fmt_b, preset, fast: bool) -> Fraction:
    """c.1 (fast: one chain over K) and c.2 (slow: chains of slow_chunk elements, fp32-summed in K order)."""
    if fast:
        return chain(pairs, fmt_a, fmt_b, preset)
    size = preset.slow_chunk
    return fp32_sum(chain(pairs[i:i + size], fmt_a, fmt_b, preset) for i in range(0, len(pairs), size))


# ---------------------------------------------------------------------------------------------------------------
# (d) Split-K
# ---------------------------------------------------------------------------------------------------------------

def ceil_div(x: int, y: int) -> int:
    return -(-x // y)


def tile(pairs, t: int, width: int):
    """k-tile t (k = width*t ... width*t + width - 1), zero padded past K (d.1 step 1, d.2 step 1)."""
    part = pairs[t * width:(t + 1) * width]
    return part + [(0, 0)] * (width - len(part))


def contiguous_split_tiles(K: int, S: int):
    """d.1 step 2: split s owns tiles [s*q, min((s+1)*q, T)), q = ceil(T/S); late splits may own none."""
    T = ceil_div(K, CONTIGUOUS_TILE)
    q = ceil_div(T, S)
    return [list(range(s * q, min((s + 1) * q, T))) for s in range(S)]


def interleaved_split_tiles(K: int, S: int):
    """d.2 steps 1-2: 64-wide tiles, count padded to Tp = ceil(T/S)*S, split s owns s, s+S, s+2S, ..."""
    Tp = ceil_div(ceil_div(K, INTERLEAVED_TILE), S) * S
    return [list(range(s, Tp, S)) for s in range(S)]


def split_partial(pairs, tiles, width, slow_group, fmt_a, fmt_b, preset, fast) -> Fraction:
    """Partial p_s of one split (d.1 step 3, d.2 steps 3-4).

    Fast: one chain over the concatenation of its tiles.  Slow: a new chain every slow_group own tiles,
    the chain results fp32-summed in order from +0 (an empty split gives +0).
    """
    if fast:
        return chain([pr for t in tiles for pr in tile(pairs, t, width)], fmt_a, fmt_b, preset)
    groups = [tiles[i:i + slow_group] for i in range(0, len(tiles), slow_group)]
    return fp32_sum(chain([pr for t in g for pr in tile(pairs, t, width)], fmt_a, fmt_b, preset) for g in groups)


def combine_serial(partials, add):
    """d.1 step 4 / d.2 step 5 serial: ((p0 (+) p1) (+) p2) ..."""
    acc = partials[0]
    for p in partials[1:]:
        acc = add(acc, p)
    return acc


def combine_pairwise(partials, add):
    """d.2 step 5 pairwise: h = ceil(S/2); slot_i = p_i (+) p_(i+h) if i+h < S-1 else p_i;
    acc = p_(S-1), then acc = acc (+) slot_i for i = 0 .. h-1.  `add` is a parameter so that the order
    itself can be tested symbolically."""
    S = len(partials)
    h = ceil_div(S, 2)
    slots = [add(partials[i], partials[i + h]) if i + h < S - 1 else partials[i] for i in range(h)]
    acc = partials[S - 1]
    for slot in slots:
        acc = add(acc, slot)
    return acc


def split_k(pairs, fmt_a, fmt_b, preset, fast: bool, S: int, scheme: str) -> Fraction:
    """(d) Accumulator of one output with numSplitsK = S > 1 under the given scheme."""
    K = len(pairs)
    if scheme == "contiguous":
        layout, width, slow_group = contiguous_split_tiles(K, S), CONTIGUOUS_TILE, 1
    elif scheme in ("serial", "pairwise"):
        layout, width, slow_group = interleaved_split_tiles(K, S), INTERLEAVED_TILE, 2
    else:
        raise ValueError(f"unknown split scheme {scheme!r}")
    partials = [split_partial(pairs, tiles, width, slow_group, fmt_a, fmt_b, preset, fast) for tiles in layout]
    combine = combine_pairwise if scheme == "pairwise" else combine_serial
    return combine(partials, fp32_add_values)


# ---------------------------------------------------------------------------------------------------------------
# (c)+(d) The GEMM accumulator, with the NaN/Inf rule c.4
# ---------------------------------------------------------------------------------------------------------------

def nonfinite_dot(a_codes, b_codes, fmt_a, fmt_b) -> str:
    """c.4 (and b.4): IEEE value of the exact dot product over ALL k, given some term is NaN or Inf.

    NaN if a NaN appears (even times 0), if Inf meets 0, or if +Inf and -Inf terms meet; else the Inf's sign.
    """
    terms = [ieee_product(decode(a, fmt_a), decode(b, fmt_b)) for a, b in zip(a_codes, b_codes)]
    return ieee_sum_of_specials([t for t in terms if isinstance(t, str)])


def accumulate_one(a_codes, b_codes, fmt_a, fmt_b, preset, fast, S=1, scheme="none") -> int:
    """fp32 accumulator bits of one output (c, d, c.4)."""
    if not all(is_finite_code(x, fmt_a) for x in a_codes) or not all(is_finite_code(x, fmt_b) for x in b_codes):
        return special_bits(nonfinite_dot(a_codes, b_codes, fmt_a, fmt_b))
    if preset.slow_chunk is None and (not fast or S > 1):
        raise ValueError("this preset has no GEMM-level slow accumulation or split-K (b.2, b.3)")
    pairs = list(zip(a_codes, b_codes))
    value = unsplit(pairs, fmt_a, fmt_b, preset, fast) if S == 1 else \
        split_k(pairs, fmt_a, fmt_b, preset, fast, S, scheme)
    return round_fp32(value)  # exact: every accumulator value is an fp32 number, never -0 (c.3)


def accumulate(a_rows, b_rows, fmt_a: str, fmt_b: str, preset, fast: bool, S: int = 1,
               scheme: str = "none") -> list:
    """fp32 accumulator bit patterns [M][N] of A [M, K] times B [N, K]^T, before scaling (c, d).

    a_rows[m][k] and b_rows[n][k] are FP8 codes.  S = 1 ignores the scheme.  K = 0 gives +0 everywhere.
    """
    if S < 1:
        raise ValueError("S must be >= 1")
    if S > 1 and scheme not in SPLIT_SCHEMES:
        raise ValueError(f"split-K needs one of {SPLIT_SCHEMES}, got {scheme!r}")
    return [[accumulate_one(a, b, fmt_a, fmt_b, preset, fast, S, scheme) for b in b_rows] for a in a_rows]


# ---------------------------------------------------------------------------------------------------------------
# (e) Epilogue
# ---------------------------------------------------------------------------------------------------------------

FP8_OUTPUTS = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
OUTPUT_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


def convert_fp32(y_bits: int, out: str) -> int:
    """e.3 for float32/bfloat16/float16: RNE from the fp32 y (a second rounding), overflow to Inf,
    the sign of zero kept, NaN canonical (e.4)."""
    y = fp32_value(y_bits)
    if isinstance(y, str):
        return special_bits(y, out)
    return round_to(y, out, negative_zero=is_negative(y_bits, "float32"))


def convert_fp8(y_bits: int, scale_result_bits, out: str) -> int:
    """e.3 for FP8 outputs: y' = RNE_fp32(y * scale_result) if given; clamp to +-max (Inf too; NaN passes);
    RNE to the FP8 format; the sign of zero kept; NaN canonical 0x7F (e.4)."""
    fmt = FP8_OUTPUTS[out]
    if scale_result_bits is not None:
        y_bits = fp32_mul(y_bits, scale_result_bits)
    y = fp32_value(y_bits)
    if y == NAN:
        return FORMATS[fmt].canonical_nan
    limit = FORMATS[fmt].max_finite
    negative = is_negative(y_bits, "float32")
    clamped = limit if y == POS_INF else -limit if y == NEG_INF else min(max(y, -limit), limit)
    return round_to(clamped, fmt, negative_zero=negative)


def epilogue(acc_bits: int, scale_a_bits: int, scale_b_bits: int, scale_result_bits, out: str) -> int:
    """(e) Output bits from the fp32 accumulator and tensor-wise fp32 scales.

    alpha = RNE_fp32(scale_a * scale_b) (e.1); y = FMA(acc, alpha, +0) (e.2); then conversion (e.3).
    scale_result (None or fp32 bits) only acts on FP8 outputs.
    """
    if out not in OUTPUT_DTYPES:
        raise ValueError(f"unknown output dtype {out!r}")
    alpha_bits = fp32_mul(scale_a_bits, scale_b_bits)
    y_bits = fp32_fma_plus_zero(acc_bits, alpha_bits)
    if out in FP8_OUTPUTS:
        return convert_fp8(y_bits, scale_result_bits, out)
    if out == "float32":
        return CANONICAL_NAN_FP32 if fp32_value(y_bits) == NAN else y_bits
    return convert_fp32(y_bits, out)


def scaled_mm(a_rows, w_rows, fmt_a, fmt_b, scale_a_bits, scale_b_bits, out, preset, fast, S=1,
              scheme="none", scale_result_bits=None) -> list:
    """Output bits [M][N] of scaled_mm(A, W.t(), ...) for arguments that pass validation (f): the K = 0 early
    return of f.3 (+0 whatever the scales), else accumulate (c, d) then the epilogue (e) per element."""
    if a_rows and not a_rows[0]:
        return [[0] * len(w_rows) for _ in a_rows]
    acc = accumulate(a_rows, w_rows, fmt_a, fmt_b, preset, fast, S, scheme)
    return [[epilogue(x, scale_a_bits, scale_b_bits, scale_result_bits, out) for x in row] for row in acc]


# ---------------------------------------------------------------------------------------------------------------
# f.9 Instruction-level dot
# ---------------------------------------------------------------------------------------------------------------

def dot_block(c_bits: int, pairs, fmt_a, fmt_b, preset) -> int:
    """One block of the instruction-level chain, on fp32 bits (so that c may be -0, huge, Inf or NaN).

    Special values (b.4), our reading: the block result is what IEEE arithmetic on the exact values gives,
    i.e. if c or any product is non-finite the block returns NaN (any NaN, Inf x 0, +Inf with -Inf) or the
    Inf; Inf then propagates through later blocks like an IEEE sum (Inf + finite = Inf).
    Finite case: b.1 with c's true exponent (the min_exp and -126 clamps act here), or b.2 whose late add
    is an IEEE fp32 add with the bits of c (so -0 and overflow follow IEEE).  A b.1 result >= 2**128
    becomes +-Inf (b.1 step 7); smaller truncated results are exact in fp32.
    """
    c = fp32_value(c_bits)
    products = [ieee_product(decode(a, fmt_a), decode(b, fmt_b)) for a, b in pairs]
    specials = [t for t in products + [c] if isinstance(t, str)]
    if specials:
        return special_bits(ieee_sum_of_specials(specials))
    if preset.late_c:
        d = block_step(Fraction(0), pairs, fmt_a, fmt_b, preset)  # d (+) +0 = d exactly (d is never -0)
        return fp32_add(round_fp32(d), c_bits)
    return round_fp32(block_step(c, pairs, fmt_a, fmt_b, preset))


def dot(a_codes, b_codes, fmt_a: str, fmt_b: str, c_bits: int, preset) -> int:
    """f.9: one chain over K, nfma at a time (last block zero padded), from the fp32 accumulator c_bits.

    Any format pair (E5M2 x E5M2 included).  Returns fp32 bits, NaN canonical.  K = 0 (no block at all)
    returns c unchanged (our reading: a chain with no blocks applies no block step).
    """
    if len(a_codes) != len(b_codes):
        raise ValueError("a and b must have the same length")
    acc = c_bits
    for start in range(0, len(a_codes), preset.nfma):
        pairs = list(zip(a_codes[start:start + preset.nfma], b_codes[start:start + preset.nfma]))
        acc = dot_block(acc, pairs, fmt_a, fmt_b, preset)
    return CANONICAL_NAN_FP32 if fp32_value(acc) == NAN else acc


# ---------------------------------------------------------------------------------------------------------------
# Row-wise epilogue of torch 2.7.1's CUTLASS kernel f8f8bf16_rowwise (sm_90)
#
# Written from the design note (scaling-recipes.md section 2) and RowwiseScaledMM.cu: the EVT tree
# Cast(Add(Bias, Multiply(WScale, Multiply(XScale, Acc)))), every node one fp32 round-to-nearest operation, the
# bias a bf16 widened exactly (a missing bias is a broadcast +0), the cast RN to bf16.  XScale is the scale of the
# problem's rows: in the transposed problem that is w_scale, so the first multiply is by w_scale[n].
#
# These use plain integers (value = m * 2**e) instead of Fractions: the epilogue tests run it on 10**5 outputs.
# ``tests/test_rowwise.py`` checks them against the Fraction operations above.
# ---------------------------------------------------------------------------------------------------------------

_F32_EMIN_LSB = -149  # exponent of the least significant bit of the fp32 subnormals
_BF16_EMIN_LSB = -133


def _int_decode(bits: int, exp_bits: int, mant_bits: int):
    """(negative, m, e, special) with value m * 2**e; special is None, NAN, POS_INF or NEG_INF."""
    negative = bool(bits >> (exp_bits + mant_bits) & 1)
    field = (bits >> mant_bits) & ((1 << exp_bits) - 1)
    mant = bits & ((1 << mant_bits) - 1)
    bias = (1 << (exp_bits - 1)) - 1
    if field == (1 << exp_bits) - 1:
        return negative, 0, 0, (NAN if mant else (NEG_INF if negative else POS_INF))
    if field == 0:
        return negative, mant, 1 - bias - mant_bits, None
    return negative, mant | (1 << mant_bits), field - bias - mant_bits, None


def _int_round(negative: bool, m: int, e: int, exp_bits: int, mant_bits: int, lsb_min: int) -> int:
    """Bits of RNE(+-m * 2**e) (m > 0) in an IEEE format with gradual underflow; overflow gives Inf."""
    q = max(e + m.bit_length() - (mant_bits + 1), lsb_min)  # exponent of the result's last place
    shift = q - e
    if shift > 0:
        kept, rest = m >> shift, m & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if rest > half or (rest == half and kept & 1):
            kept += 1
    else:
        kept = m << -shift
    if kept >> (mant_bits + 1):
        kept >>= 1
        q += 1
    sign = (1 << (exp_bits + mant_bits)) if negative else 0
    if kept < (1 << mant_bits):
        return sign | kept  # subnormal or zero (q is lsb_min)
    field = q + mant_bits + (1 << (exp_bits - 1)) - 1
    if field >= (1 << exp_bits) - 1:
        return sign | (((1 << exp_bits) - 1) << mant_bits)
    return sign | (field << mant_bits) | (kept - (1 << mant_bits))


def int_fp32_mul(x_bits: int, y_bits: int) -> int:
    """One fp32 RN multiplication (as fp32_mul): Inf * 0 = NaN, NaN canonical, zero sign = XOR of the signs."""
    xn, xm, xe, xs = _int_decode(x_bits, 8, 23)
    yn, ym, ye, ys = _int_decode(y_bits, 8, 23)
    negative = xn != yn
    if xs == NAN or ys == NAN:
        return CANONICAL_NAN_FP32
    if xs or ys:
        if (xs is None and xm == 0) or (ys is None and ym == 0):
            return CANONICAL_NAN_FP32
        return 0xFF800000 if negative else 0x7F800000
    if xm == 0 or ym == 0:
        return 0x80000000 if negative else 0
    return _int_round(negative, xm * ym, xe + ye, 8, 23, _F32_EMIN_LSB)


def int_fp32_add(x_bits: int, y_bits: int) -> int:
    """One fp32 RN addition (as fp32_add): an exact zero sum is +0 except (-0) + (-0); +Inf + -Inf = NaN."""
    xn, xm, xe, xs = _int_decode(x_bits, 8, 23)
    yn, ym, ye, ys = _int_decode(y_bits, 8, 23)
    if xs or ys:
        return special_bits(ieee_sum_of_specials([s for s in (xs, ys) if s]))
    e = min(xe, ye)
    total = (-1 if xn else 1) * (xm << (xe - e)) + (-1 if yn else 1) * (ym << (ye - e))
    if total == 0:
        return 0x80000000 if (xn and yn and xm == 0 and ym == 0) else 0
    return _int_round(total < 0, abs(total), e, 8, 23, _F32_EMIN_LSB)


def int_fp32_to_bf16(y_bits: int) -> int:
    """RN of an fp32 value to bf16 (as convert_fp32(..., 'bfloat16')): NaN canonical 0x7FFF, zero sign kept."""
    negative, m, e, special = _int_decode(y_bits, 8, 23)
    if special == NAN:
        return FORMATS["bfloat16"].canonical_nan
    if special:
        return 0xFF80 if negative else 0x7F80
    if m == 0:
        return 0x8000 if negative else 0
    return _int_round(negative, m, e, 8, 7, _BF16_EMIN_LSB)


def rowwise_epilogue(acc_bits: int, x_scale_bits: int, w_scale_bits: int, bias_bits, transposed: bool) -> int:
    """bf16 bits of torch 2.7.1's row-wise epilogue of one fp32 accumulator.

    Untransposed problem: y = RN(bias + RN(w * RN(x * acc))); transposed: y = RN(bias + RN(x * RN(w * acc)));
    ``bias_bits``: bf16 bits or None (+0).  Output RN to bf16.
    """
    first, second = (w_scale_bits, x_scale_bits) if transposed else (x_scale_bits, w_scale_bits)
    scaled = int_fp32_mul(second, int_fp32_mul(first, acc_bits))
    bias32 = 0 if bias_bits is None else bias_bits << 16  # bf16 widens exactly: the same bits, 16 zeros after
    return int_fp32_to_bf16(int_fp32_add(bias32, scaled))


def rowwise_runs_transposed(M: int, N: int) -> bool:
    """The dispatch of dispatch_fp8_rowwise_kernel_on_cluster_size_and_transpose (torch 2.7.1, sm_90), restated
    from the source: M and N rounded up to multiples of 64, then the first rule that applies."""
    M, N = -(-M // 64) * 64, -(-N // 64) * 64
    rules = (
        (M == 64 and N >= 3072, False),
        (N == 64 and M >= 3072, True),
        (M == 192 and N >= 4096, True),
        (N == 192 and M >= 4096, False),
        (M * N <= 4096 * 4096 and M % 256 > 0 and N % 256 == 0, True),
        (M * N <= 4096 * 4096 and N % 256 > 0 and M % 256 == 0, False),
    )
    for applies, transposed in rules:
        if applies:
            return transposed
    if M % 256 > 0 and N % 256 > 0:
        return (M <= N) ^ (M * N <= 1024 * 1024)
    if M >= 4096 and N >= 4096:
        return not M >= N
    return True

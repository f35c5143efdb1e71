"""Input formats: code tables and torch dtype names (semantics.md (a)).

The GEMM formats (:data:`FORMATS`) are the OCP/NVIDIA FP8 encodings ``float8_e4m3fn`` ("e4m3") and
``float8_e5m2`` ("e5m2"). The block-scaled instructions of Blackwell GPUs (``kind::mxf8f6f4``, ``kind::mxf4nvf4``)
also take the OCP MX element formats FP6 E3M2 ("e3m2"), FP6 E2M3 ("e2m3") and FP4 E2M1 ("e2m1"), which have no
NaN or Inf (:data:`OPERAND_FORMATS`; FP6 has no torch dtype, so its codes travel as uint8; FP4's dtype
``float4_e2m1fn_x2`` packs two codes per byte, the low nibble first: :func:`unpack_fp4`), and two scale formats
(:data:`SCALE_FORMATS`): UE8M0 (``float8_e8m0fnu``: 2**(code - 127), code 0xFF is NaN) and UE4M3 (an E4M3 code
read without its sign bit: NVFP4's block scales, passed as ``float8_e4m3fn``; code 0x7F is NaN). Sources: the OCP
Microscaling Formats (MX) v1.0 specification (element and scale encodings) and the PTX ISA's block-scaled ``mma``
(UE4M3); MMA-Sim 2.1.1 decodes them the same way.

The arithmetic (:mod:`mmaemu.arith`) works on decoded codes: a finite nonzero value v is
``sig * 2**(ex - MANT_BITS[fmt])`` with a signed integer significand ``sig`` and the alignment exponent
``ex = max(floor(log2|v|), EMIN[fmt])`` (subnormal codes take EMIN). Zero and non-finite codes decode to
``sig = 0`` and the exponent :data:`ABSENT_EXP`, so they never win an exponent maximum (zero products are
excluded terms; NaN/Inf follow the rule of semantics.md c.4, applied separately).

Importing this module does not import torch.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "FORMATS",
    "OPERAND_FORMATS",
    "SCALE_FORMATS",
    "CODE_BITS",
    "FP8_MAX",
    "MAX_FINITE",
    "CANONICAL_NAN_BITS",
    "EMIN",
    "MANT_BITS",
    "ABSENT_EXP",
    "DTYPE_OF",
    "TORCH_NAMES",
    "FormatNameError",
    "fmt_of",
    "dtype_text",
    "dtype_name",
    "decode",
    "nonfinite_mask",
    "is_fp8_dtype",
    "significands",
    "exponents",
    "scale_significands",
    "scale_exponents",
    "decode_scales",
    "unpack_fp4",
    "pack_fp4",
    "TOP_FIELD",
    "encode",
    "random_codes",
]

FORMATS = ("e4m3", "e5m2")
OPERAND_FORMATS = FORMATS + ("e3m2", "e2m3", "e2m1")
SCALE_FORMATS = ("ue8m0", "ue4m3")
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
MAX_FINITE = dict(FP8_MAX, e3m2=28.0, e2m3=7.5, e2m1=6.0)
EXP_BITS = {"e4m3": 4, "e5m2": 5, "e3m2": 3, "e2m3": 2, "e2m1": 2}
MANT_BITS = {"e4m3": 3, "e5m2": 2, "e3m2": 2, "e2m3": 3, "e2m1": 1}
CODE_BITS = {fmt: 1 + EXP_BITS[fmt] + MANT_BITS[fmt] for fmt in OPERAND_FORMATS}
_BIAS = {fmt: (1 << (EXP_BITS[fmt] - 1)) - 1 for fmt in OPERAND_FORMATS}
EMIN = {fmt: 1 - _BIAS[fmt] for fmt in OPERAND_FORMATS}
# The largest exponent field of a finite FP8 code (e4m3: mantissa 7 there is NaN; e5m2: field 31 is Inf/NaN).
TOP_FIELD = {"e4m3": 15, "e5m2": 30}
# Canonical NaN bit pattern of every output dtype (semantics.md e.4).
CANONICAL_NAN_BITS = {
    "float32": 0x7FFFFFFF,
    "bfloat16": 0x7FFF,
    "float16": 0x7FFF,
    "float8_e4m3fn": 0x7F,
    "float8_e5m2": 0x7F,
}
# Exponent of zero and non-finite codes: far below any exponent the arithmetic meets (>= -160 even for the tiny
# accumulators of model.dot), and it fits the int16 exponent arrays.
ABSENT_EXP = -(1 << 14)
# The torch dtype name of each FP8 GEMM format.
TORCH_NAMES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
_FORMAT_OF_NAME = {**{fmt: fmt for fmt in FORMATS}, **{name: fmt for fmt, name in TORCH_NAMES.items()}}


def _fields(code, fmt):
    mbits, ebits = MANT_BITS[fmt], EXP_BITS[fmt]
    sign = -1 if code >> (ebits + mbits) & 1 else 1
    exp_field = (code >> mbits) & ((1 << ebits) - 1)
    mant = code & ((1 << mbits) - 1)
    return sign, exp_field, mant


def _is_nan(code, fmt):
    _, e, m = _fields(code, fmt)
    if fmt == "e4m3":
        return e == 15 and m == 7
    return fmt == "e5m2" and e == 31 and m != 0


def _is_inf(code, fmt):
    _, e, m = _fields(code, fmt)
    return fmt == "e5m2" and e == 31 and m == 0


class CodeTables(NamedTuple):
    """The decoding tables of one format (operand or scale), each indexed by code, read-only."""

    values: np.ndarray  # float64 value (NaN and +-Inf included, -0.0 kept)
    significands: np.ndarray  # int8 signed integer significand (0 for zero and the special codes)
    exponents: np.ndarray  # int16 exponent (ABSENT_EXP for zero and the special codes)
    special: np.ndarray  # bool: the code is NaN or Inf (an operand format), NaN (a scale format)


def _frozen_tables(value, sig, exp, special) -> CodeTables:
    """The four tables of a format, made read-only (they are shared by every caller)."""
    for table in (value, sig, exp, special):
        table.setflags(write=False)
    return CodeTables(value, sig, exp, special)


def _build_tables(fmt):
    """Per code: value (float64, NaN/Inf included), signed significand, alignment exponent, non-finite flag.

    FP8 tables have 256 entries; FP6 and FP4 tables 64 and 16 (codes in the low bits, sign bit highest)."""
    mbits, bias, size = MANT_BITS[fmt], _BIAS[fmt], 1 << CODE_BITS[fmt]
    value = np.zeros(size, np.float64)
    sig = np.zeros(size, np.int8)
    exp = np.full(size, ABSENT_EXP, np.int16)
    nonfinite = np.zeros(size, np.bool_)
    for code in range(size):
        sign, e, m = _fields(code, fmt)
        if _is_nan(code, fmt):
            value[code], nonfinite[code] = np.nan, True
        elif _is_inf(code, fmt):
            value[code], nonfinite[code] = sign * np.inf, True
        elif e == 0 and m == 0:
            value[code] = -0.0 if sign < 0 else 0.0
        else:
            implicit = 0 if e == 0 else 1 << mbits
            ex = EMIN[fmt] if e == 0 else e - bias
            sig[code] = sign * (implicit + m)
            exp[code] = ex
            value[code] = sign * (implicit + m) * 2.0 ** (ex - mbits)
    return _frozen_tables(value, sig, exp, nonfinite)


_TABLES = {fmt: _build_tables(fmt) for fmt in OPERAND_FORMATS}


def _check_fmt(fmt):
    if fmt not in _TABLES:
        raise ValueError(f"unknown operand format {fmt!r}; expected one of {OPERAND_FORMATS}")
    return _TABLES[fmt]


def values(fmt):
    """Table of the decoded values of a format, indexed by code (float64; NaN and +-Inf included, -0.0 kept)."""
    return _check_fmt(fmt).values


def significands(fmt):
    """Table of the signed integer significands (0 for zero and non-finite codes)."""
    return _check_fmt(fmt).significands


def exponents(fmt):
    """Table of the alignment exponents ex (ABSENT_EXP for zero and non-finite codes)."""
    return _check_fmt(fmt).exponents


def nonfinite_codes(fmt):
    """Boolean table: the code is NaN or Inf."""
    return _check_fmt(fmt).special


def decode(codes, fmt):
    """Decode codes (numpy uint8 array, torch uint8/float8 tensor or int) to float64 values; FP6/FP4 codes must
    lie below 2**CODE_BITS[fmt] (one code per element, not packed: see :func:`unpack_fp4`)."""
    return values(fmt)[_checked_codes(codes, fmt)]


def nonfinite_mask(codes, fmt):
    """True where a code is NaN or Inf."""
    return nonfinite_codes(fmt)[_checked_codes(codes, fmt)]


def _checked_codes(codes, fmt):
    codes = _as_codes(codes)
    size = 1 << CODE_BITS.get(fmt, 8)
    if size < 256 and np.any(np.asarray(codes) >= size):
        raise ValueError(f"{fmt} codes are {CODE_BITS[fmt]}-bit (below {size}), one per element; got a larger "
                         "value (packed FP4 bytes go through mmaemu.formats.unpack_fp4 first)")
    return codes


def _as_codes(codes):
    if isinstance(codes, (int, np.integer)):
        return int(codes) & 0xFF
    if isinstance(codes, np.ndarray):
        return codes.astype(np.uint8, copy=False)
    import torch

    if isinstance(codes, torch.Tensor):
        return codes.detach().cpu().view(torch.uint8).numpy()
    return np.asarray(codes, dtype=np.uint8)


class _DtypeOf(dict):
    """``DTYPE_OF["e4m3"]`` -> torch.float8_e4m3fn, resolved on first use so that import stays torch-free."""

    def __missing__(self, fmt):
        import torch

        if fmt not in TORCH_NAMES:
            raise KeyError(fmt)
        dtype = getattr(torch, TORCH_NAMES[fmt])
        self[fmt] = dtype
        return dtype


DTYPE_OF = _DtypeOf()


class FormatNameError(TypeError, ValueError):
    """Not a modelled FP8 format or float8 dtype (:func:`fmt_of`).

    Both a TypeError and a ValueError: the profile and split-K functions have always raised TypeError for a bad
    dtype, and ``fmt_of`` and :func:`mmaemu.quantize.quantize` ValueError.
    """


def dtype_text(x):
    """'float8_e4m3fn' for torch.float8_e4m3fn, 'torch.float8_e4m3fn' or 'float8_e4m3fn'; None for anything that
    is neither a string nor a torch dtype (recognised by its type, so that torch is not imported)."""
    if isinstance(x, str):
        text = x
    elif type(x).__name__ == "dtype" and type(x).__module__ == "torch":
        text = str(x)
    else:
        return None
    return text[len("torch."):] if text.startswith("torch.") else text


def dtype_name(dtype):
    """'float8_e5m2' for torch.float8_e5m2, or for anything that prints as ``torch.<name>`` (a descriptor's dtype
    name); None for None. The one spelling of a dtype's name in logs, messages and comparisons."""
    return None if dtype is None else str(dtype).rpartition(".")[2]


def fmt_of(dtype) -> str:
    """The format name "e4m3"/"e5m2" of a torch float8 dtype, of its name (with or without "torch.") or of a
    format name; :class:`FormatNameError` otherwise.

    The one reading of a format from a dtype: the fnuz variants are refused by name, because cuBLASLt on sm_89/sm_90
    uses the OCP formats only.
    """
    text = dtype_text(dtype)
    if text in _FORMAT_OF_NAME:
        return _FORMAT_OF_NAME[text]
    if text is not None and text.endswith("fnuz"):
        raise FormatNameError(f"{text} is not supported: the reference GPUs use float8_e4m3fn / float8_e5m2")
    raise FormatNameError(f"expected torch.float8_e4m3fn, torch.float8_e5m2, 'e4m3' or 'e5m2', got {dtype!r}")


def is_fp8_dtype(dtype) -> bool:
    """True for float8_e4m3fn and float8_e5m2 (the modelled formats), given as torch dtypes or their names."""
    text = dtype_text(dtype)
    return text in _FORMAT_OF_NAME and text not in FORMATS


def encode(fmt, sign, field, mant):
    """uint8 FP8 codes from sign bits (0/1), exponent fields and mantissas (arrays or ints, broadcast together).

    Every code is finite: fields are clipped to [0, TOP_FIELD[fmt]], mantissas taken modulo 2**MANT_BITS[fmt], and
    an e4m3 mantissa at field 15 is clipped to 6 (the NaN code S.1111.111 is never produced).
    """
    mbits = MANT_BITS[fmt]
    field = np.clip(np.asarray(field), 0, TOP_FIELD[fmt]).astype(np.int64)
    mant = np.asarray(mant).astype(np.int64) % (1 << mbits)
    if fmt == "e4m3":
        mant = np.where(field == TOP_FIELD[fmt], np.minimum(mant, 6), mant)
    return ((np.asarray(sign).astype(np.int64) << 7) | (field << mbits) | mant).astype(np.uint8)


def random_codes(rng, shape, fmt, *, fields=None, spread=None, centre=0):
    """Random finite FP8 codes of ``fmt`` (the package's one generator: the self-tests, the instruction probe and
    the benchmark scripts draw their operands here; the test oracle keeps its own).

    Signs and mantissas are uniform. Exponent fields are uniform over ``fields = (lo, hi)`` (inclusive; default
    the normal fields 1..TOP_FIELD), or, given ``spread``, normally distributed around the binade 2**centre with
    a standard deviation of ``spread`` binades, rounded and clipped to ``fields`` (default 0..TOP_FIELD,
    subnormals included). ``rng`` is a numpy Generator, drawn in the order signs, fields, mantissas.
    """
    lo, hi = fields if fields is not None else (1 if spread is None else 0, TOP_FIELD[fmt])
    sign = rng.integers(0, 2, shape)
    if spread is None:
        field = rng.integers(lo, hi + 1, shape)
    else:
        field = np.clip(np.rint(rng.normal(centre + _BIAS[fmt], spread, shape)), lo, hi)
    return encode(fmt, sign, field, rng.integers(0, 1 << MANT_BITS[fmt], shape))


def _build_scale_tables(fmt):
    """Per scale code: value (float64, NaN included), integer significand and exponent (value = sig * 2**(exp -
    mant_bits)), and the NaN flag. UE8M0: sig 1, exp code - 127. UE4M3: the E4M3 decoding of code & 0x7F."""
    value = np.zeros(256, np.float64)
    sig = np.zeros(256, np.int8)
    exp = np.full(256, ABSENT_EXP, np.int16)
    nan = np.zeros(256, np.bool_)
    for code in range(256):
        if fmt == "ue8m0":
            if code == 0xFF:
                value[code], nan[code] = np.nan, True
            else:
                sig[code], exp[code], value[code] = 1, code - 127, 2.0 ** (code - 127)
            continue
        low = code & 0x7F
        value[code], nan[code] = abs(values("e4m3")[low]), bool(nonfinite_codes("e4m3")[low])
        sig[code], exp[code] = significands("e4m3")[low], exponents("e4m3")[low]
    return _frozen_tables(value, sig, exp, nan)


_SCALE_TABLES = {fmt: _build_scale_tables(fmt) for fmt in SCALE_FORMATS}
SCALE_MANT_BITS = {"ue8m0": 0, "ue4m3": 3}


def _check_scale_fmt(fmt):
    if fmt not in _SCALE_TABLES:
        raise ValueError(f"unknown scale format {fmt!r}; expected one of {SCALE_FORMATS}")
    return _SCALE_TABLES[fmt]


def decode_scales(codes, fmt):
    """Decode scale codes (uint8) of ``fmt`` ("ue8m0" or "ue4m3") to float64 values (NaN for the NaN code)."""
    return _check_scale_fmt(fmt).values[_as_codes(codes)]


def scale_significands(fmt):
    """Table of the scales' integer significands (value = sig * 2**(exp - SCALE_MANT_BITS[fmt]); 0 for a zero
    UE4M3 scale and for NaN)."""
    return _check_scale_fmt(fmt).significands


def scale_exponents(fmt):
    """Table of the scales' exponents (ABSENT_EXP for a zero UE4M3 scale and for NaN)."""
    return _check_scale_fmt(fmt).exponents


def scale_nan_codes(fmt):
    """Boolean table: the scale code is NaN."""
    return _check_scale_fmt(fmt).special


def unpack_fp4(packed):
    """FP4 codes [..., 2n] (uint8, 0..15) of packed bytes [..., n] as torch's ``float4_e2m1fn_x2`` holds them:
    element 2i is the low nibble of byte i, element 2i + 1 the high nibble."""
    packed = _as_codes(packed)
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[:-1] + (-1,))


def pack_fp4(codes):
    """The inverse of :func:`unpack_fp4`: bytes [..., n] of FP4 codes [..., 2n] (low nibble first)."""
    codes = np.asarray(codes, np.uint8)
    if codes.shape[-1] % 2 or np.any(codes > 0x0F):
        raise ValueError("pack_fp4: an even number of 4-bit codes (0..15) along the last axis is required")
    pairs = codes.reshape(codes.shape[:-1] + (-1, 2))
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)

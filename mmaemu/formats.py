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
    "fmt_of",
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
_TORCH_NAMES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


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
    for table in (value, sig, exp, nonfinite):
        table.setflags(write=False)
    return value, sig, exp, nonfinite


_TABLES = {fmt: _build_tables(fmt) for fmt in OPERAND_FORMATS}


def _check_fmt(fmt):
    if fmt not in _TABLES:
        raise ValueError(f"unknown operand format {fmt!r}; expected one of {OPERAND_FORMATS}")
    return _TABLES[fmt]


def values(fmt):
    """Table of the decoded values of a format, indexed by code (float64; NaN and +-Inf included, -0.0 kept)."""
    return _check_fmt(fmt)[0]


def significands(fmt):
    """Table of the signed integer significands (0 for zero and non-finite codes)."""
    return _check_fmt(fmt)[1]


def exponents(fmt):
    """Table of the alignment exponents ex (ABSENT_EXP for zero and non-finite codes)."""
    return _check_fmt(fmt)[2]


def nonfinite_codes(fmt):
    """Boolean table: the code is NaN or Inf."""
    return _check_fmt(fmt)[3]


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

        if fmt not in _TORCH_NAMES:
            raise KeyError(fmt)
        dtype = getattr(torch, _TORCH_NAMES[fmt])
        self[fmt] = dtype
        return dtype


DTYPE_OF = _DtypeOf()


def fmt_of(dtype):
    """The format name of a torch float8 dtype (or its name): "e4m3" or "e5m2"; ValueError otherwise."""
    name = str(dtype).replace("torch.", "")
    for fmt, torch_name in _TORCH_NAMES.items():
        if name == torch_name or name == fmt:
            return fmt
    raise ValueError(f"{dtype} is not a modelled FP8 format (float8_e4m3fn or float8_e5m2)")


def is_fp8_dtype(dtype):
    """True for float8_e4m3fn and float8_e5m2 (the modelled formats)."""
    name = str(dtype).replace("torch.", "")
    return name in _TORCH_NAMES.values()


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
    for table in (value, sig, exp, nan):
        table.setflags(write=False)
    return value, sig, exp, nan


_SCALE_TABLES = {fmt: _build_scale_tables(fmt) for fmt in SCALE_FORMATS}
SCALE_MANT_BITS = {"ue8m0": 0, "ue4m3": 3}


def _check_scale_fmt(fmt):
    if fmt not in _SCALE_TABLES:
        raise ValueError(f"unknown scale format {fmt!r}; expected one of {SCALE_FORMATS}")
    return _SCALE_TABLES[fmt]


def decode_scales(codes, fmt):
    """Decode scale codes (uint8) of ``fmt`` ("ue8m0" or "ue4m3") to float64 values (NaN for the NaN code)."""
    return _check_scale_fmt(fmt)[0][_as_codes(codes)]


def scale_significands(fmt):
    """Table of the scales' integer significands (value = sig * 2**(exp - SCALE_MANT_BITS[fmt]); 0 for a zero
    UE4M3 scale and for NaN)."""
    return _check_scale_fmt(fmt)[1]


def scale_exponents(fmt):
    """Table of the scales' exponents (ABSENT_EXP for a zero UE4M3 scale and for NaN)."""
    return _check_scale_fmt(fmt)[2]


def scale_nan_codes(fmt):
    """Boolean table: the scale code is NaN."""
    return _check_scale_fmt(fmt)[3]


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

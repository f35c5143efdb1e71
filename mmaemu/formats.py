"""FP8 input formats: code tables and torch dtype names (semantics.md (a)).

Only the OCP/NVIDIA encodings are modelled: ``float8_e4m3fn`` ("e4m3") and ``float8_e5m2`` ("e5m2").

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
    "FP8_MAX",
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
]

FORMATS = ("e4m3", "e5m2")
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
EMIN = {"e4m3": -6, "e5m2": -14}
MANT_BITS = {"e4m3": 3, "e5m2": 2}
_BIAS = {"e4m3": 7, "e5m2": 15}
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
    mbits = MANT_BITS[fmt]
    sign = -1 if code & 0x80 else 1
    exp_field = (code >> mbits) & ((1 << (7 - mbits)) - 1)
    mant = code & ((1 << mbits) - 1)
    return sign, exp_field, mant


def _is_nan(code, fmt):
    _, e, m = _fields(code, fmt)
    if fmt == "e4m3":
        return e == 15 and m == 7
    return e == 31 and m != 0


def _is_inf(code, fmt):
    _, e, m = _fields(code, fmt)
    return fmt == "e5m2" and e == 31 and m == 0


def _build_tables(fmt):
    """Per code: value (float64, NaN/Inf included), signed significand, alignment exponent, non-finite flag."""
    mbits, bias = MANT_BITS[fmt], _BIAS[fmt]
    value = np.zeros(256, np.float64)
    sig = np.zeros(256, np.int8)
    exp = np.full(256, ABSENT_EXP, np.int16)
    nonfinite = np.zeros(256, np.bool_)
    for code in range(256):
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


_TABLES = {fmt: _build_tables(fmt) for fmt in FORMATS}


def _check_fmt(fmt):
    if fmt not in _TABLES:
        raise ValueError(f"unknown FP8 format {fmt!r}; expected one of {FORMATS}")
    return _TABLES[fmt]


def values(fmt):
    """Table of the 256 decoded values of a format (float64; NaN and +-Inf included, -0.0 kept)."""
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
    """Decode FP8 codes (numpy uint8 array, torch uint8/float8 tensor or int) to float64 values."""
    return values(fmt)[_as_codes(codes)]


def nonfinite_mask(codes, fmt):
    """True where a code is NaN or Inf."""
    return nonfinite_codes(fmt)[_as_codes(codes)]


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

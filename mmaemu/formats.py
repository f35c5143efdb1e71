"""FP8 input formats: code tables and torch dtype names (semantics.md (a)).

Only the OCP/NVIDIA encodings are modelled: ``float8_e4m3fn`` ("e4m3") and ``float8_e5m2`` ("e5m2").

The arithmetic (:mod:`mmaemu.arith`) works on decoded codes: a finite nonzero value v is
``sig * 2**(ex - MANT_BITS[fmt])`` with a signed integer significand ``sig`` and the alignment exponent
``ex = max(floor(log2|v|), EMIN[fmt])`` (subnormal codes take EMIN). Zero and non-finite codes decode to
``sig = 0`` and the exponent :data:`ABSENT_EXP`, so they never win an exponent maximum (zero products are
excluded terms; NaN/Inf follow the rule of semantics.md c.4, applied separately).

Importing this module imports neither torch nor numpy (the code tables are built on first use), so that the
command line and the platform tables can name formats cheaply.
"""

from __future__ import annotations

__all__ = [
    "FORMATS",
    "FP8_MAX",
    "CANONICAL_NAN_BITS",
    "EMIN",
    "MANT_BITS",
    "ABSENT_EXP",
    "DTYPE_OF",
    "TORCH_NAMES",
    "FormatNameError",
    "fmt_of",
    "dtype_text",
    "decode",
    "nonfinite_mask",
    "is_fp8_dtype",
    "significands",
    "exponents",
    "TOP_FIELD",
    "encode",
    "random_codes",
]

FORMATS = ("e4m3", "e5m2")
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
EMIN = {"e4m3": -6, "e5m2": -14}
MANT_BITS = {"e4m3": 3, "e5m2": 2}
_BIAS = {"e4m3": 7, "e5m2": 15}
# The largest exponent field of a finite code (e4m3: mantissa 7 there is NaN; e5m2: field 31 is Inf/NaN).
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
# The torch dtype name of each modelled format.
TORCH_NAMES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
_FORMAT_OF_NAME = {**{fmt: fmt for fmt in FORMATS}, **{name: fmt for fmt, name in TORCH_NAMES.items()}}


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
    import numpy as np

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


_TABLES = {}


def _check_fmt(fmt):
    if fmt not in FORMATS:
        raise ValueError(f"unknown FP8 format {fmt!r}; expected one of {FORMATS}")
    tables = _TABLES.get(fmt)
    if tables is None:  # two threads may both build them: the same read-only tables
        tables = _TABLES.setdefault(fmt, _build_tables(fmt))
    return tables


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
    import numpy as np

    if isinstance(codes, (int, np.integer)):
        return int(codes) & 0xFF
    if isinstance(codes, np.ndarray):
        return codes.astype(np.uint8, copy=False)
    import torch

    if isinstance(codes, torch.Tensor):
        return codes.detach().cpu().view(torch.uint8).numpy()
    return np.asarray(codes, dtype=np.uint8)


def encode(fmt, sign, field, mant):
    """uint8 codes from sign bits (0/1), exponent fields and mantissas (arrays or ints, broadcast together).

    Every code is finite: fields are clipped to [0, TOP_FIELD[fmt]], mantissas taken modulo 2**MANT_BITS[fmt], and
    an e4m3 mantissa at field 15 is clipped to 6 (the NaN code S.1111.111 is never produced).
    """
    import numpy as np

    mbits = MANT_BITS[fmt]
    field = np.clip(np.asarray(field), 0, TOP_FIELD[fmt]).astype(np.int64)
    mant = np.asarray(mant).astype(np.int64) % (1 << mbits)
    if fmt == "e4m3":
        mant = np.where(field == TOP_FIELD[fmt], np.minimum(mant, 6), mant)
    return ((np.asarray(sign).astype(np.int64) << 7) | (field << mbits) | mant).astype(np.uint8)


def random_codes(rng, shape, fmt, *, fields=None, spread=None, centre=0):
    """Random finite codes of ``fmt`` (the package's one generator: the self-tests, the instruction probe and the
    benchmark scripts draw their operands here; the test oracle keeps its own).

    Signs and mantissas are uniform. Exponent fields are uniform over ``fields = (lo, hi)`` (inclusive; default
    the normal fields 1..TOP_FIELD), or, given ``spread``, normally distributed around the binade 2**centre with
    a standard deviation of ``spread`` binades, rounded and clipped to ``fields`` (default 0..TOP_FIELD,
    subnormals included). ``rng`` is a numpy Generator, drawn in the order signs, fields, mantissas.
    """
    import numpy as np

    lo, hi = fields if fields is not None else (1 if spread is None else 0, TOP_FIELD[fmt])
    sign = rng.integers(0, 2, shape)
    if spread is None:
        field = rng.integers(lo, hi + 1, shape)
    else:
        field = np.clip(np.rint(rng.normal(centre + _BIAS[fmt], spread, shape)), lo, hi)
    return encode(fmt, sign, field, rng.integers(0, 1 << MANT_BITS[fmt], shape))


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

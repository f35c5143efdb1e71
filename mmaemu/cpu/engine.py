"""NumPy-level entry points of the CPU backend: decode, schedule, run the compiled loops."""

from __future__ import annotations

import numpy as np

from .. import formats
from ..arith.epilogue import OUT_CODES
from ..arith.params import preset_params, schedule_params
from ..arith.rounding import FLOAT32, value_of_bits
from ..arith.epilogue import scale_product
from .gemm import accumulate_gemm, epilogue_gemm, override_nonfinite

_OUT_VIEW = {"float32": np.uint32, "bfloat16": np.uint16, "float16": np.uint16,
             "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}


def decode_operand(codes: np.ndarray, fmt: str):
    """Significands (int8) and alignment exponents (int16) of a [rows, K] array of FP8 codes."""
    return formats.significands(fmt)[codes], formats.exponents(fmt)[codes]


def accumulate_codes(a_codes, b_codes, fmt_a, fmt_b, preset, use_fast_accum, splits=1, scheme="none", *,
                     reference=False):
    """fp32 accumulators [M, N] of A [M, K] times B [N, K]^T given as uint8 FP8 codes (semantics.md (c), (d)).

    Every format pair is accepted (E5M2 x E5M2 included); non-finite codes follow the rule of c.4.
    ``reference=True`` runs the straightforward loop (one chain walk per output) instead of the fast path.
    """
    a_codes = np.ascontiguousarray(a_codes, dtype=np.uint8)
    b_codes = np.ascontiguousarray(b_codes, dtype=np.uint8)
    (M, K), N = a_codes.shape, b_codes.shape[0]
    schedule = schedule_params(preset, K, use_fast_accum, splits, scheme)
    params = preset_params(preset, fmt_a, fmt_b)
    out = np.zeros((M, N), np.float32)
    if M == 0 or N == 0 or K == 0:
        return out
    sa, ea = decode_operand(a_codes, fmt_a)
    sb, eb = decode_operand(b_codes, fmt_b)
    accumulate_gemm(sa, ea, sb, eb, schedule, params, out)
    a_flags = formats.nonfinite_mask(a_codes, fmt_a).any(axis=1)
    b_flags = formats.nonfinite_mask(b_codes, fmt_b).any(axis=1)
    if a_flags.any() or b_flags.any():
        override_nonfinite(a_codes, a_flags, formats.values(fmt_a), b_codes, b_flags, formats.values(fmt_b),
                           out.view(np.int32))
    return out


def float32_value(bits: int) -> float:
    """Exact value of an fp32 bit pattern (integer decoding: immune to denormals-are-zero)."""
    return float(value_of_bits(np.int64(bits), FLOAT32))


def epilogue_codes(acc, scale_a_bits, scale_b_bits, scale_result_bits, out_dtype_name):
    """Output bit patterns (unsigned integers of the output's width) of fp32 accumulators (semantics.md (e)).

    Scales are given as fp32 bit patterns; ``scale_result_bits`` None when absent (ignored unless FP8 output).
    """
    acc = np.ascontiguousarray(acc, dtype=np.float32)
    alpha = scale_product(float32_value(scale_a_bits), float32_value(scale_b_bits))
    has_sr = scale_result_bits is not None
    scale_result = float32_value(scale_result_bits) if has_sr else 1.0
    out = np.empty(acc.size, _OUT_VIEW[out_dtype_name])
    epilogue_gemm(acc.reshape(-1), alpha, OUT_CODES[out_dtype_name], scale_result, has_sr, out)
    return out.reshape(acc.shape)

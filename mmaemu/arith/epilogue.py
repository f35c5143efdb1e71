"""The epilogue of torch._scaled_mm with tensor-wise scales (semantics.md (e)).

1. alpha = RNE_fp32(scale_a * scale_b);
2. y = RNE_fp32(acc * alpha + (+0)), a fused multiply-add with a +0 addend (cuBLAS beta = 0): an exactly zero
   product gives +0, an underflowing nonzero product keeps its sign;
3. conversion to the output dtype: bf16/fp16 round the fp32 y a second time; FP8 outputs multiply by
   scale_result (if given), clamp to the format's largest finite value, then round; NaN is canonical.
"""

import math

import numpy as np

from .._jit import arithmetic
from .rounding import BFLOAT16, E4M3, E5M2, FLOAT16, FLOAT32, round_float32, round_to_format

# Output dtype codes, in the order of the split-K tables' `out` column.
OUT_FLOAT32, OUT_BFLOAT16, OUT_FLOAT16, OUT_E4M3, OUT_E5M2 = 0, 1, 2, 3, 4
OUT_CODES = {"float32": 0, "bfloat16": 1, "float16": 2, "float8_e4m3fn": 3, "float8_e5m2": 4}
# Canonical NaN patterns (e.4), indexed by output code.
_NAN_F32, _NAN_16, _NAN_F8 = 0x7FFFFFFF, 0x7FFF, 0x7F


@arithmetic
def scale_product(scale_a, scale_b):
    """alpha = RNE_fp32(scale_a * scale_b) as an exact float64 (step 1; Inf * 0 -> NaN)."""
    return round_float32(scale_a * scale_b)


@arithmetic
def ffma_plus_zero(acc, alpha):
    """y = RNE_fp32(acc * alpha + (+0)) as an exact float64 (step 2)."""
    if acc != acc or alpha != alpha:
        return math.nan
    if acc == 0 or alpha == 0:
        if math.isinf(acc) or math.isinf(alpha):
            return math.nan
        return 0.0  # -0 + (+0) = +0: an exactly zero product never gives -0
    return round_float32(acc * alpha)


@arithmetic
def fp8_bits(y, scale_result, has_scale_result, fmt, largest):
    """FP8 output code of y (step 3): optional scale_result, clamp to +-largest, RNE; NaN -> 0x7F."""
    if has_scale_result:
        y = round_float32(y * scale_result)
    if y != y:
        return _NAN_F8
    return round_to_format(min(max(y, -largest), largest), fmt)


@arithmetic
def output_bits(y, out_code, scale_result, has_scale_result):
    """Bit pattern of y in the output dtype (step 3); y is the exact fp32 value of step 2."""
    if out_code == OUT_E4M3:
        return fp8_bits(y, scale_result, has_scale_result, E4M3, 448.0)
    if out_code == OUT_E5M2:
        return fp8_bits(y, scale_result, has_scale_result, E5M2, 57344.0)
    if out_code == OUT_FLOAT32:
        return _NAN_F32 if y != y else round_to_format(y, FLOAT32)
    if y != y:
        return _NAN_16
    return round_to_format(y, BFLOAT16 if out_code == OUT_BFLOAT16 else FLOAT16)


@arithmetic
def epilogue_one(acc, alpha, out_code, scale_result, has_scale_result):
    """Output bits of one fp32 accumulator value (acc as float32 or float64, alpha exact float64)."""
    y = ffma_plus_zero(np.float64(acc), alpha)
    return output_bits(y, out_code, scale_result, has_scale_result)

"""The epilogue of torch._scaled_mm with tensor-wise scales (semantics.md (e)).

1. alpha = RNE_fp32(scale_a * scale_b);
2. y = RNE_fp32(acc * alpha + (+0)), a fused multiply-add with a +0 addend (cuBLAS beta = 0): an exactly zero
   product gives +0, an underflowing nonzero product keeps its sign;
3. conversion to the output dtype: bf16/fp16 round the fp32 y a second time; FP8 outputs multiply by
   scale_result (if given), clamp to the format's largest finite value, then round; NaN is canonical.

How each step is computed, and why it is exact (every rounding is the single IEEE rounding the contract names):

* Step 2 is one float64 multiplication and one float64 -> fp32 conversion. acc and alpha are fp32 values: their
  product has at most 24 + 24 = 48 significant bits and an exponent between 2**-298 and 2**256, so the float64
  product is the exact product, normal in float64 (no subnormal float64 ever occurs). The conversion to fp32 is
  then the one RNE rounding of that exact value (IEEE convertFormat: gradual underflow, overflow to +-Inf,
  NaN stays NaN; Inf * 0 is already NaN in the product). An exactly zero product is replaced by +0 (a select,
  the -0 + (+0) = +0 of the addend); a nonzero product that underflows converts to a signed zero itself.
* Step 3 works on the fp32 bits of y (:func:`narrow_bits`): for a result that is normal in the narrower format,
  the classic integer RNE ``(|bits| + rebias + (half - 1) + lowest kept bit) >> dropped bits``, whose carry moves
  into the exponent field exactly as a rounding up to the next binade does; for a subnormal result, one fp32
  addition ``|y| + M`` with ``ulp(M)`` equal to the format's subnormal step, whose RNE rounding puts the
  rounded multiple of that step in the low bits of the sum (the sum stays in M's binade: |y| is below the
  format's smallest normal, which is at most M). Overflow in an IEEE format is a minimum with the Inf pattern
  (the integer formula is monotone in the bits). The FP8 clamp happens before, so E4M3/E5M2 never overflow.

The conversions are IEEE operations of the processor, so they need gradual underflow: mmaemu refuses to compute on
a CPU thread that flushes fp32 subnormals (:mod:`mmaemu.base.fpmode`), as its tile engine already relies on fp32
subnormals; numba compiles the kernels for CUDA devices without fast-math (no flush-to-zero). Every branch on a
value is a select, so the loops of :mod:`mmaemu.cpu.fused` vectorise. ``tests/test_epilogue.py`` checks every
function here against the integer rounding of :mod:`.rounding` on every fp32 exponent with the rounding-relevant
low bits, and the whole epilogue against the independent oracle (``tests/oracle.py``).
"""

import numpy as np

from ..base._jit import arithmetic
from .fp32 import float32_bits, float32_from_bits
from .rounding import BFLOAT16, E4M3, E5M2, FLOAT16, round_float32

# Output dtype codes, in the order of the split-K tables' `out` column.
OUT_FLOAT32, OUT_BFLOAT16, OUT_FLOAT16, OUT_E4M3, OUT_E5M2 = 0, 1, 2, 3, 4
OUT_CODES = {"float32": 0, "bfloat16": 1, "float16": 2, "float8_e4m3fn": 3, "float8_e5m2": 4}
# Canonical NaN patterns (e.4), indexed by output code.
_NAN_F32, _NAN_16, _NAN_F8 = 0x7FFFFFFF, 0x7FFF, 0x7F
#: Largest finite values of the FP8 outputs, the clamp of step 3.
E4M3_LARGEST, E5M2_LARGEST = 448.0, 57344.0


@arithmetic
def scale_product(scale_a, scale_b):
    """alpha = RNE_fp32(scale_a * scale_b) as an exact float64 (step 1; Inf * 0 -> NaN)."""
    return round_float32(scale_a * scale_b)


@arithmetic
def ffma_plus_zero(acc, alpha):
    """y = RNE_fp32(acc * alpha + (+0)) as a float32 (step 2; acc and alpha fp32 values, as float32 or float64):
    the exact float64 product rounded once by the conversion, an exactly zero product giving +0."""
    product = np.float64(acc) * np.float64(alpha)
    y = np.float32(product)
    return np.float32(0.0) if product == 0.0 else y


@arithmetic
def narrow_bits(y, fmt):
    """Bit pattern of RNE(y) in ``fmt`` (:mod:`.rounding`'s ``(frac_bits, exp_bits, ieee_specials)``, at most 23
    fraction bits and 8 exponent bits) for an fp32 value y (float32, or float64 holding one; not NaN): overflow
    gives Inf where the format has one (the FP8 outputs are clamped before). See the module docstring."""
    frac_bits, exp_bits, ieee_specials = fmt
    bias = (1 << (exp_bits - 1)) - 1
    dropped = 23 - frac_bits
    magnitude_f32 = abs(np.float32(y))
    magnitude = np.int64(float32_bits(magnitude_f32))
    sign = np.int64(1 << (exp_bits + frac_bits)) if float32_bits(np.float32(y)) < 0 else np.int64(0)
    normal = (magnitude + ((bias - 127) << 23) + ((1 << (dropped - 1)) - 1) + ((magnitude >> dropped) & 1)) >> dropped
    magic_bits = (127 + 24 - bias - frac_bits) << 23  # M = 2**(24 - bias - frac_bits): ulp(M) = 2**(1-bias-frac)
    subnormal = np.int64(float32_bits(magnitude_f32 + float32_from_bits(np.int32(magic_bits)))) - magic_bits
    q = subnormal if magnitude < ((128 - bias) << 23) else normal
    if ieee_specials:
        q = min(q, np.int64(((1 << exp_bits) - 1) << frac_bits))
    return sign | q


@arithmetic
def fp8_bits(y, scale_result, has_scale_result, fmt, largest):
    """FP8 output code of the fp32 value y (step 3): optional scale_result (y' = RNE_fp32(y * scale_result), an
    exact float64 product rounded once), clamp to +-largest (+-Inf too), RNE; NaN -> 0x7F."""
    y32 = np.float32(y)
    if has_scale_result:
        y32 = np.float32(np.float64(y32) * np.float64(scale_result))
    clamped = min(max(y32, np.float32(-largest)), np.float32(largest))
    bits = narrow_bits(clamped, fmt)
    return np.int64(_NAN_F8) if y32 != y32 else bits


@arithmetic
def output_bits(y, out_code, scale_result, has_scale_result):
    """Bit pattern of y in the output dtype (step 3); y is the exact fp32 value of step 2 (float32 or float64)."""
    y32 = np.float32(y)
    if out_code == OUT_E4M3:
        return fp8_bits(y32, scale_result, has_scale_result, E4M3, E4M3_LARGEST)
    if out_code == OUT_E5M2:
        return fp8_bits(y32, scale_result, has_scale_result, E5M2, E5M2_LARGEST)
    if out_code == OUT_FLOAT32:
        bits = np.int64(float32_bits(y32)) & 0xFFFFFFFF
        return np.int64(_NAN_F32) if y32 != y32 else bits
    if out_code == OUT_BFLOAT16:  # two calls, not one of a chosen tuple: each folds to its constants
        bits = narrow_bits(y32, BFLOAT16)
    else:
        bits = narrow_bits(y32, FLOAT16)
    return np.int64(_NAN_16) if y32 != y32 else bits


@arithmetic
def epilogue_one(acc, alpha, out_code, scale_result, has_scale_result):
    """Output bits of one fp32 accumulator value (acc as float32 or float64, alpha exact float64)."""
    return output_bits(ffma_plus_zero(acc, alpha), out_code, scale_result, has_scale_result)


@arithmetic
def epilogue_span(acc, out_bits, lo, hi, alpha, out_code, scale_result, has_scale_result):
    """``out_bits[i] = epilogue_one(acc[i], ...)`` for i in lo .. hi-1 (acc, out_bits: 1-D, e.g. a row).

    One loop per output code, each calling :func:`epilogue_one` with that code as a constant: the loop body is
    then free of branches (the selects of step 3) and LLVM vectorises it. Measured on this project's 2-core
    machine (AVX-512), fp32 accumulators 256 x 4096: 0.3-0.6 ns per output, against 8-23 ns with the code read per
    output and 20-31 ns for the integer rounding this module used before (docs/performance.md). The five loops are
    written out on purpose: one loop in a helper called with the five constants measured 4x slower (1-2 ns per
    output: LLVM did not specialise the helper). The loops index views of the span from 0: ``acc[i]`` for i in
    ``range(lo, hi)`` (a signed index that may be negative, wrapped per element) compiled to gathers and byte-wise
    stores, 1.1-1.8 ns per output (7 Dec 2026, docs/performance.md "MiniLM's profile").
    """
    values, out = acc[lo:hi], out_bits[lo:hi]  # indexed from 0: no per-element wrap of a negative index
    if out_code == OUT_FLOAT32:
        for i in range(values.size):
            out[i] = epilogue_one(values[i], alpha, OUT_FLOAT32, scale_result, has_scale_result)
    elif out_code == OUT_BFLOAT16:
        for i in range(values.size):
            out[i] = epilogue_one(values[i], alpha, OUT_BFLOAT16, scale_result, has_scale_result)
    elif out_code == OUT_FLOAT16:
        for i in range(values.size):
            out[i] = epilogue_one(values[i], alpha, OUT_FLOAT16, scale_result, has_scale_result)
    elif out_code == OUT_E4M3:
        for i in range(values.size):
            out[i] = epilogue_one(values[i], alpha, OUT_E4M3, scale_result, has_scale_result)
    else:
        for i in range(values.size):
            out[i] = epilogue_one(values[i], alpha, OUT_E5M2, scale_result, has_scale_result)

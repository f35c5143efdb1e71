"""The per-tensor FP8 cast of :func:`mmaemu.quantize.quantize` as one compiled loop, for tensors on the CPU.

Per element (the module docstring of :mod:`mmaemu.quantize`): ``y = fp32(x) * s``, one IEEE fp32 multiplication
(numba multiplies two float32 values in float32), then the saturating round to nearest even of
:func:`mmaemu.arith.epilogue.fp8_bits` (clamp to the format's largest value, +-Inf included, RNE with gradual
underflow, NaN -> 0x7F): the same rule as the epilogue's FP8 outputs, so one function owns it. The torch-operation
version (``quantize._round_to_fp8``) stays for tensors on a GPU; ``tests/test_quantize.py`` checks the two against
each other on random and adversarial inputs.
"""

from __future__ import annotations

import numpy as np

from ..base._jit import arithmetic
from ..arith.epilogue import E4M3_LARGEST, E5M2_LARGEST, fp8_bits
from ..arith.rounding import E4M3, E5M2
from . import threads

__all__ = ["quantize_fp8"]

#: Cost of one element in the fast path's products (:mod:`.threads`): a multiplication and the rounding's selects.
CAST_WORK = 8


@arithmetic
def quantize_span(lo, hi, values, scale, e5m2, codes):
    """``codes[i]`` = FP8 code of ``values[i] * scale`` (float32 values and scale) for i in lo .. hi-1; one loop per
    format, each free of branches (vectorised)."""
    if e5m2:
        for i in range(lo, hi):
            codes[i] = fp8_bits(values[i] * scale, 1.0, False, E5M2, E5M2_LARGEST)
    else:
        for i in range(lo, hi):
            codes[i] = fp8_bits(values[i] * scale, 1.0, False, E4M3, E4M3_LARGEST)


def quantize_fp8(values: np.ndarray, scale: np.float32, fmt: str) -> np.ndarray:
    """uint8 FP8 codes (``fmt`` "e4m3" or "e5m2") of the flat float32 array ``values`` times the fp32 ``scale``."""
    codes = np.empty(values.shape, np.uint8)
    threads.parallel_for(quantize_span, values.size, CAST_WORK, values, np.float32(scale), fmt == "e5m2", codes)
    return codes

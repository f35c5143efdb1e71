"""The NaN/Inf rule of the GEMM path (semantics.md c.4, a hardware rule recorded on the RTX 4060).

An output whose row of A or column of B holds a non-finite code is the IEEE value of the exact dot product over
all k: NaN if any NaN code appears (even times zero), if some k has Inf * 0, or if there are +Inf and -Inf
terms; otherwise +-Inf. NaN is the canonical 0x7FFFFFFF. The rule overrides the accumulator after slow sums and
split combination, so it depends on neither.
"""

import math

from ..base._jit import arithmetic

NAN_BITS = 0x7FFFFFFF
POS_INF_BITS = 0x7F800000
NEG_INF_BITS = -0x00800000  # 0xFF800000 as a signed 32-bit integer
FINITE = 0  # marker: the row and column hold only finite codes


@arithmetic
def nonfinite_accumulator(a_codes, b_codes, a_table, b_table):
    """int32 bits of the accumulator of a row of A and a row of B holding non-finite codes; FINITE if none.

    ``a_codes``/``b_codes``: FP8 codes (length K); ``a_table``/``b_table``: float64 values of the 256 codes.
    """
    positive = False
    negative = False
    nonfinite = False
    for k in range(a_codes.shape[0]):
        a = a_table[a_codes[k]]
        b = b_table[b_codes[k]]
        if a != a or b != b:
            return NAN_BITS
        if math.isinf(a) or math.isinf(b):
            nonfinite = True
            if a == 0 or b == 0:
                return NAN_BITS
            if (a > 0) == (b > 0):
                positive = True
            else:
                negative = True
    if not nonfinite:
        return FINITE
    if positive and negative:
        return NAN_BITS
    return POS_INF_BITS if positive else NEG_INF_BITS

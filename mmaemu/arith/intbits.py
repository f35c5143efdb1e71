"""Integer helpers of the arithmetic: bit length and truncating shifts.

Everything here is plain integer code so that it compiles identically for CPUs and CUDA GPUs and never
depends on a floating-point mode (rounding direction, flush-to-zero).
"""

from ..base._jit import arithmetic

# Right shifts by 63 or more are undefined in LLVM; every magnitude shifted here is below 2**62.
MAX_SHIFT = 62


@arithmetic
def bit_length(x):
    """Number of bits of a non-negative integer below 2**64 (0 for 0), branch-free: a binary search over the
    widths 32, 16, 8, 4, 2, 1 (a loop of six known trips, which LLVM unrolls: as fast as written out)."""
    n = 0
    for step in range(6):
        width = 32 >> step
        b = (x >= (1 << width)) * width
        x >>= b
        n += b
    return n + x


@arithmetic
def shift_toward_zero(x, shift):
    """x * 2**shift truncated toward zero (magnitude truncation, symmetric for negative x).

    ``shift`` may be negative (right shift, truncating) or non-negative (exact left shift).
    """
    if shift >= 0:
        return x << shift
    s = min(-shift, MAX_SHIFT)
    if x >= 0:
        return x >> s
    return -((-x) >> s)

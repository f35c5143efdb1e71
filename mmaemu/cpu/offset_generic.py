"""The CPU offset engine's per-output steps as instantiations of the one generic source,
:mod:`mmaemu.arith.offset_step`, on 512-bit vectors (its lane operations typed by :mod:`.simd`'s overloads): the
start, the block end and the byte counters of :mod:`.offset_kernel`, drop-in replacements for its
``vector_start``, ``vector_end`` and ``row_count`` (same arguments, same bits; ``tests/test_offset_generic.py``).

Measured as fast as the hand-written vector forms (docs/performance.md, "One offset block-step source"), and
``cuda:offset`` compiles the same source on scalars to the same SASS. What stays per target, and why: the
exponent pass (bytes here, 16-bit add-max words or bf16 power sums on the GPU), the count's unit (byte counters
summed at the block end here, ``dp4a`` on the GPU) and the tile layout (:mod:`.offset_kernel`'s docstring).
"""

from ..base._jit import arithmetic
from ..arith.fp32 import FP32_FRACTION_BITS
from ..arith.offset_step import correction_flags, step_end, step_start
from .simd import add_i32, broadcast_load_i32, lshr_i32, mul_i32, shl_i32


@arithmetic
def vector_start(e, c, v):
    """:func:`mmaemu.arith.offset_step.step_start` on one vector, E_prod from its byte pass maximum ``e`` (int32
    lanes; :func:`mmaemu.arith.offset.exponent_bytes`): the offset sum and the threshold word."""
    return step_start(add_i32(shl_i32(e, FP32_FRACTION_BITS), v.exponent_bias), c, v, True)


@arithmetic
def vector_end(s, n, v):
    """:func:`mmaemu.arith.offset_step.step_end` on one vector, the count n the sum of its four byte counters."""
    return step_end(s, lshr_i32(mul_i32(n, v.byte_sum), 24), v)


@arithmetic
def row_count(a, row, g, low0, low1, sign0, sign1, t, n):
    """The byte counters of one 4-k group of a row: :func:`mmaemu.arith.offset_step.correction_flags`' bit 7
    shifted to bit 0 of its byte and added, both vectors."""
    low_a, sign_a = broadcast_load_i32(a.low, row, g), broadcast_load_i32(a.sign, row, g)
    flags0 = correction_flags(low_a, low0, sign_a, sign0, t[0])
    flags1 = correction_flags(low_a, low1, sign_a, sign1, t[1])
    return add_i32(n[0], lshr_i32(flags0, 7)), add_i32(n[1], lshr_i32(flags1, 7))

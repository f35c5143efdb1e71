"""The end of a compiled CPU call: the NaN/Inf rule (semantics.md c.4) and the epilogue of a block of outputs from
their fp32 accumulators, for the tensor-wise scales and the row-wise ones (:class:`mmaemu.cpu.fused.RowwiseScales`).
Shared by the kept calls of :mod:`mmaemu.cpu.fused` and of :mod:`mmaemu.cpu.offset_rows`; nothing of the arithmetic
is written here (:func:`mmaemu.arith.special.nonfinite_accumulator`, :func:`mmaemu.arith.epilogue.epilogue_span`,
:func:`mmaemu.arith.rowwise.rowwise_epilogue_span`)."""

from numba import types
from numba.core.extending import overload

from ..base._jit import arithmetic
from ..arith.epilogue import epilogue_span, scale_product
from ..arith.rounding import FLOAT32, value_of_bits
from ..arith.rowwise import rowwise_epilogue_span
from ..arith.special import FINITE, nonfinite_accumulator

# The scales of one call in one int64 array: fp32 bits of scale_a, scale_b, scale_result, and 1 if scale_result.
SCALE_A, SCALE_B, SCALE_RESULT, HAS_SCALE_RESULT = 0, 1, 2, 3


def epilogue_row(scales, acc, out_bits, m, n_lo, n_hi, out_code):
    """Outputs [n_lo, n_hi) of row m into ``out_bits`` from the accumulators ``acc`` [M, N]: the tensor-wise
    epilogue (semantics.md (e)) for int64 ``scales`` (:data:`SCALE_A`, ...), the row-wise one for
    :class:`RowwiseScales`. Compiled per type of ``scales`` (an overload): one loop source for both recipes."""
    raise NotImplementedError("compiled only (an overload)")


@overload(epilogue_row, target="generic")
def _epilogue_row(scales, acc, out_bits, m, n_lo, n_hi, out_code):
    if isinstance(scales, types.Array):
        def tensorwise(scales, acc, out_bits, m, n_lo, n_hi, out_code):
            alpha = scale_product(value_of_bits(scales[SCALE_A], FLOAT32), value_of_bits(scales[SCALE_B], FLOAT32))
            has_scale_result = scales[HAS_SCALE_RESULT] != 0
            scale_result = value_of_bits(scales[SCALE_RESULT], FLOAT32) if has_scale_result else 1.0
            epilogue_span(acc[m], out_bits[m], n_lo, n_hi, alpha, out_code, scale_result, has_scale_result)
        return tensorwise

    def rowwise(scales, acc, out_bits, m, n_lo, n_hi, out_code):
        rowwise_epilogue_span(acc[m], out_bits[m], n_lo, n_hi, scales.x_values[m], scales.w_values,
                              scales.bias_values, scales.x_first)
    return rowwise


@arithmetic
def finish_block(m_lo, m_hi, n_lo, n_hi, a_codes, a_flags, a_table, b_codes, b_flags, b_table, acc, acc_bits,
                 scales, out_code, out_bits):
    """For the outputs [m_lo, m_hi) x [n_lo, n_hi): the NaN/Inf rule (semantics.md c.4; rows of A and of B holding a
    non-finite code: ``a_flags``, ``b_flags``) on the accumulators ``acc`` (``acc_bits``: its int32 view), then the
    epilogue (:func:`epilogue_row`: semantics.md (e) with the scales' bits ``scales``, :data:`SCALE_A`, ..., or the
    row-wise epilogue of :class:`RowwiseScales`) into ``out_bits``."""
    any_b = False  # a column of the block with a non-finite code: else rows without one skip the column scan
    for n in range(n_lo, n_hi):
        any_b |= b_flags[n]
    for m in range(m_lo, m_hi):
        if a_flags[m]:
            for n in range(n_lo, n_hi):
                bits = nonfinite_accumulator(a_codes[m], b_codes[n], a_table, b_table)
                if bits != FINITE:
                    acc_bits[m, n] = bits
        elif any_b:
            for n in range(n_lo, n_hi):
                if b_flags[n]:
                    bits = nonfinite_accumulator(a_codes[m], b_codes[n], a_table, b_table)
                    if bits != FINITE:
                        acc_bits[m, n] = bits
        epilogue_row(scales, acc, out_bits, m, n_lo, n_hi, out_code)

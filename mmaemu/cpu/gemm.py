"""Parallel CPU loops (``prange``) over the compiled arithmetic.

Outputs are computed in tiles of ``TILE_M x TILE_N`` so that the decoded rows of A and B of a tile stay in
the core's cache while every output of the tile walks its K chains. Extra memory: the output and the decoded
operands (3 bytes per input element); nothing grows with M * N * K.
"""

from numba import prange

from .._jit import arithmetic_parallel
from ..arith.epilogue import epilogue_one
from ..arith.schedule import accumulate_one
from ..arith.special import FINITE, nonfinite_accumulator

TILE_M = 16
TILE_N = 16


@arithmetic_parallel
def accumulate_gemm(sa, ea, sb, eb, schedule, params, out):
    """out[m, n] = fp32 accumulator of row m of A and row n of B (finite codes; semantics.md (c), (d))."""
    M, K = sa.shape
    N = sb.shape[0]
    tiles_m = (M + TILE_M - 1) // TILE_M
    tiles_n = (N + TILE_N - 1) // TILE_N
    for job in prange(tiles_m * tiles_n):
        m0 = (job // tiles_n) * TILE_M
        n0 = (job % tiles_n) * TILE_N
        for m in range(m0, min(m0 + TILE_M, M)):
            for n in range(n0, min(n0 + TILE_N, N)):
                out[m, n] = accumulate_one(sa[m], ea[m], sb[n], eb[n], K, schedule, params)


@arithmetic_parallel
def override_nonfinite(a_codes, a_flags, a_table, b_codes, b_flags, b_table, out_bits):
    """Apply the NaN/Inf rule (c.4) to every output whose row of A or row of B holds a non-finite code.

    ``a_flags``/``b_flags``: per row, True if it holds a non-finite code. ``out_bits``: int32 view of the fp32
    accumulator [M, N].
    """
    M, N = out_bits.shape
    for m in prange(M):
        for n in range(N):
            if a_flags[m] or b_flags[n]:
                bits = nonfinite_accumulator(a_codes[m], b_codes[n], a_table, b_table)
                if bits != FINITE:
                    out_bits[m, n] = bits


@arithmetic_parallel
def epilogue_gemm(acc, alpha, out_code, scale_result, has_scale_result, out_bits):
    """out_bits[i] = output bits of acc[i] (semantics.md (e)); acc and out_bits are flat."""
    for i in prange(acc.shape[0]):
        out_bits[i] = epilogue_one(acc[i], alpha, out_code, scale_result, has_scale_result)

"""The CPU engine of the chunked reference kernels (:mod:`mmaemu.model.chunked`): block-wise scaled GEMMs.

* fast path: for each chunk, the chunk's partials of the whole GEMM by the tiled fast path
  (:func:`mmaemu.cpu.engine.accumulate_codes` on the chunk's k range: one chain from +0, the NaN/Inf rule on the
  chunk's codes), then :func:`mmaemu.arith.scaled.combine_chunk_rows` enters them into the accumulators;
* ``reference=True``: every output walks its chunks alone with
  :func:`mmaemu.arith.scaled.accumulate_chunked_one`, the reference the fast path is tested against.

Both give the same bits. Extra memory of the fast path: one [M, N] fp32 array of partials.
"""

from __future__ import annotations

import numpy as np

from .. import formats
from .._jit import arithmetic
from ..arith.scaled import accumulate_chunked_one, chunked_output_bits, combine_chunk_rows
from ..model.presets import get_preset
from . import threads
from .engine import EPILOGUE_WORK, REFERENCE_PRODUCT_WORK, accumulate_codes, decode_operand

_TILE = 16


@arithmetic
def accumulate_chunked_reference(lo, hi, sa, ea, sb, eb, a_codes, b_codes, a_table, b_table, scales_a, scales_b,
                                 chunk, rule, params, out):
    """out[m, n] = accumulate_chunked_one(row m of A, row n of B) for the outputs of jobs lo .. hi-1 (a job: a
    tile of 16 x 16 outputs, row-major over the tiles)."""
    M, K = sa.shape
    N = sb.shape[0]
    tiles_n = (N + _TILE - 1) // _TILE
    for job in range(lo, hi):
        m0 = (job // tiles_n) * _TILE
        n0 = (job % tiles_n) * _TILE
        for m in range(m0, min(m0 + _TILE, M)):
            for n in range(n0, min(n0 + _TILE, N)):
                out[m, n] = accumulate_chunked_one(sa[m], ea[m], sb[n], eb[n], a_codes[m], b_codes[n], a_table,
                                                   b_table, K, scales_a[m], scales_b[n], chunk, rule, params)


@arithmetic
def output_rows(lo, hi, mode, final, d_bits, out_bits):
    """out_bits[i] = chunked_output_bits(mode, final[i], d_bits[i]) for i in lo .. hi-1 (flat arrays)."""
    for i in range(lo, hi):
        out_bits[i] = chunked_output_bits(mode, final[i], d_bits[i])


def _check_scales(scales, rows, chunks, name):
    scales = np.ascontiguousarray(scales, dtype=np.float32)
    if scales.shape != (rows, chunks):
        raise ValueError(f"{name} must have shape {(rows, chunks)} (one fp32 scale per row and chunk), got "
                         f"{scales.shape}")
    return scales


def accumulate_chunked_codes(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel, *, reference=False):
    """fp32 accumulators [M, N] of A [M, K] times B [N, K]^T (uint8 FP8 codes) by a chunked kernel.

    ``scales_a`` [M, ceil(K / chunk)], ``scales_b`` [N, ceil(K / chunk)]: the fp32 scale of each row's chunk (a
    block scale of B is given once per row of B it covers). K must be positive.
    """
    from ..arith.params import preset_params

    a_codes = np.ascontiguousarray(a_codes, dtype=np.uint8)
    b_codes = np.ascontiguousarray(b_codes, dtype=np.uint8)
    (M, K), N = a_codes.shape, b_codes.shape[0]
    preset = get_preset(kernel.preset)
    if kernel.chunk % preset.nfma:
        raise ValueError(f"kernel {kernel.name!r}: chunk {kernel.chunk} is not a multiple of nfma={preset.nfma}")
    chunks = -(-K // kernel.chunk)
    scales_a = _check_scales(scales_a, M, chunks, "scales_a")
    scales_b = _check_scales(scales_b, N, chunks, "scales_b")
    final = np.zeros((M, N), np.float32)
    if M == 0 or N == 0 or K == 0:
        return final
    params = preset_params(preset, fmt_a, fmt_b)
    if reference:
        sa, ea = decode_operand(a_codes, fmt_a)
        sb, eb = decode_operand(b_codes, fmt_b)
        jobs = -(-M // _TILE) * -(-N // _TILE)
        threads.parallel_for(accumulate_chunked_reference, jobs, REFERENCE_PRODUCT_WORK * _TILE * _TILE * K, sa, ea,
                             sb, eb, a_codes, b_codes, np.array(formats.values(fmt_a)),
                             np.array(formats.values(fmt_b)), scales_a, scales_b, kernel.chunk, kernel.combine,
                             params, final)
        return final
    for kb in range(chunks):
        k0, k1 = kb * kernel.chunk, min((kb + 1) * kernel.chunk, K)
        partial = accumulate_codes(a_codes[:, k0:k1], b_codes[:, k0:k1], fmt_a, fmt_b, preset, True)
        threads.parallel_for(combine_chunk_rows, M, max(1, N // 8), kernel.combine, final, partial, scales_a,
                             scales_b, kb)
    return final


def chunked_output(final, kernel, d=None):
    """The output of accumulators ``final`` [M, N] by ``kernel.output``: a uint16 array of bf16 patterns, or the
    uint32 patterns of the fp32 ``RN(d + final)`` (d: an fp32 array of the same shape)."""
    from ..arith.scaled import OUTPUT_BFLOAT16

    final = np.ascontiguousarray(final, dtype=np.float32).reshape(-1)
    if kernel.output == OUTPUT_BFLOAT16:
        d_bits, out = np.zeros(final.size, np.int32), np.empty(final.size, np.uint16)
    else:
        d_bits = np.ascontiguousarray(d, dtype=np.float32).reshape(-1).view(np.int32)
        out = np.empty(final.size, np.uint32)
    threads.parallel_for(output_rows, final.size, EPILOGUE_WORK, kernel.output, final, d_bits, out)
    return out

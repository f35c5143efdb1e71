"""Block-scaled GEMMs (MXFP8, NVFP4: :mod:`mmaemu.cpu.block_scaled`) on CUDA: ``cuda:simple`` only.

One thread per output calls :func:`mmaemu.arith.block_scaled.scaled_block_chain` or
:func:`~mmaemu.arith.block_scaled.scaled_group_chain` - the functions the CPU reference loop runs - on the output's
decoded row of A and row of B in global memory (decoded on the host, as the CPU reference decodes them). Integer
arithmetic and correctly rounded float64/fp32 operations only; compiled without fast-math.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ... import formats
from ...arith import block_scaled as _block_scaled
from ...arith.params import BlockParams, preset_params
from ...cpu.block_scaled import BlockScaledGemm, reference_operands
from .. import shim
from ..simple.kernels import BLOCK, MAX_GRID_Y

shim.restore_numpy_row_stack()
shim.install_builtin_minmax()

scaled_block_chain = shim.device(_block_scaled.scaled_block_chain)
scaled_group_chain = shim.device(_block_scaled.scaled_group_chain)


@cuda.jit(fastmath=False)
def gemm_scaled_block_simple(sa, ea, sb, eb, va, vb, sva, svb, bad_a, bad_b, k, block, params, out):
    """out[m, n] = the scaled-block chain of row m of A and row n of B: one thread per output."""
    n, m = cuda.grid(2)
    if m < out.shape[0] and n < out.shape[1]:
        out[m, n] = scaled_block_chain(sa[m], ea[m], sb[n], eb[n], va[m], vb[n], sva[m], svb[n], bad_a[m], bad_b[n],
                                       k, block, params)


@cuda.jit(fastmath=False)
def gemm_scaled_group_simple(sa, ea, sb, eb, va, vb, ssa, sea, ssb, seb, sva, svb, bad_a, bad_b, k, group, block,
                             e_floor, lift, frac, frac_out, min_exp, out):
    """out[m, n] = the scaled-groups chain of row m of A and row n of B: one thread per output."""
    n, m = cuda.grid(2)
    if m < out.shape[0] and n < out.shape[1]:
        out[m, n] = scaled_group_chain(sa[m], ea[m], sb[n], eb[n], va[m], vb[n], ssa[m], sea[m], ssb[n], seb[n],
                                       sva[m], svb[n], bad_a[m], bad_b[n], k, group, block, e_floor, lift, frac,
                                       frac_out, min_exp)


def accumulate_block_scaled_numpy(a_codes, b_codes, fmt_a, fmt_b, scale_a, scale_b, scale_fmt, preset):
    """Like :func:`mmaemu.cpu.block_scaled.accumulate_block_scaled` (same arguments), computed by the kernels
    above (runs on a device or under the simulator); returns numpy fp32 [M, N], NaN canonical."""
    gemm = BlockScaledGemm(a_codes, b_codes, fmt_a, fmt_b, scale_a, scale_b, scale_fmt, preset)
    M, N, K = gemm.shape
    out = np.zeros((M, N), np.float32)
    if 0 in (M, N, K):
        return out
    ops_a, ops_b = reference_operands(gemm)
    if not preset.group:  # the scale exponents join the element exponents (semantics.md b.5)
        ops_a = (ops_a[0], ops_a[1] + np.repeat(ops_a[4], gemm.block, axis=1)) + ops_a[2:]
        ops_b = (ops_b[0], ops_b[1] + np.repeat(ops_b[4], gemm.block, axis=1)) + ops_b[2:]
    d_b = [cuda.to_device(np.ascontiguousarray(x)) for x in ops_b]
    step = MAX_GRID_Y * BLOCK
    for r0 in range(0, M, step):
        r1 = min(M, r0 + step)
        d_a = [cuda.to_device(np.ascontiguousarray(x[r0:r1])) for x in ops_a]
        (sa, ea, va, ssa, sea, sva, bad_a), (sb, eb, vb, ssb, seb, svb, bad_b) = d_a, d_b
        d_out = cuda.to_device(out[r0:r1])
        grid = ((N + BLOCK - 1) // BLOCK, (r1 - r0 + BLOCK - 1) // BLOCK)
        if preset.group:
            e_floor = formats.EMIN[fmt_a] + formats.EMIN[fmt_b]
            lift = formats.MANT_BITS[fmt_a] + formats.MANT_BITS[fmt_b] + 2 * formats.SCALE_MANT_BITS[scale_fmt]
            gemm_scaled_group_simple[grid, (BLOCK, BLOCK)](
                sa, ea, sb, eb, va, vb, ssa, sea, ssb, seb, sva, svb, bad_a, bad_b, preset.nfma, preset.group,
                gemm.block, e_floor, lift, preset.frac, preset.frac_out, preset.min_exp, d_out)
        else:
            params = BlockParams(*(int(v) for v in preset_params(preset, fmt_a, fmt_b)))
            gemm_scaled_block_simple[grid, (BLOCK, BLOCK)](sa, ea, sb, eb, va, vb, sva, svb, bad_a, bad_b,
                                                           preset.nfma, gemm.block, params, d_out)
        out[r0:r1] = d_out.copy_to_host()
    out.view(np.uint32)[np.isnan(out)] = np.uint32(0x7FFFFFFF)
    return out


def accumulate_block_scaled_cuda(a_codes, b_codes, fmt_a, fmt_b, scale_a, scale_b, scale_fmt, preset, device):
    """:func:`accumulate_block_scaled_numpy` on ``device`` (a torch CUDA device); a torch fp32 tensor there."""
    import torch

    with cuda.gpus[device.index or 0] if not shim.simulator_enabled() else _nothing():
        out = accumulate_block_scaled_numpy(a_codes, b_codes, fmt_a, fmt_b, scale_a, scale_b, scale_fmt, preset)
    return torch.from_numpy(out).to(device)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

"""Block-scaled GEMMs (MXFP8, NVFP4: :mod:`mmaemu.cpu.block_scaled`) on CUDA: ``cuda:simple`` only.

One thread per output calls :func:`mmaemu.arith.block_scaled.scaled_chain` - the function the CPU reference loop
runs - on the output's decoded row of A and row of B in global memory (decoded on the host by the CPU reference's
own preparation, :func:`mmaemu.cpu.block_scaled.gemm_chain_operands`). Integer
arithmetic and correctly rounded float64/fp32 operations only; compiled without fast-math.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...arith import block_scaled as _block_scaled
from ...cpu.block_scaled import BlockScaledGemm, ChainOperand, canonical_nan, gemm_chain_operands
from .. import shim
from ..simple.kernels import BLOCK, MAX_GRID_Y

shim.restore_numpy_row_stack()
shim.install_builtin_minmax()

scaled_chain = shim.device(_block_scaled.scaled_chain)


@cuda.jit(fastmath=False)
def gemm_scaled_simple(sa, ea, va, ssa, sea, sva, bad_a, sb, eb, vb, ssb, seb, svb, bad_b, k, block, params, gp,
                       out):
    """out[m, n] = the chain of the preset's instructions of row m of A and row n of B (the fields of their
    :class:`~mmaemu.cpu.block_scaled.ChainOperand`): one thread per output."""
    n, m = cuda.grid(2)
    if m < out.shape[0] and n < out.shape[1]:
        out[m, n] = scaled_chain(sa[m], ea[m], sb[n], eb[n], va[m], vb[n], ssa[m], sea[m], ssb[n], seb[n], sva[m],
                                 svb[n], bad_a[m], bad_b[n], k, block, params, gp)


def accumulate_block_scaled_numpy(a_codes, b_codes, fmt_a, fmt_b, scale_a, scale_b, scale_fmt, preset):
    """Like :func:`mmaemu.cpu.block_scaled.accumulate_block_scaled` (same arguments), computed by the kernel above
    (runs on a device or under the simulator) from the host preparation of the CPU reference
    (:func:`mmaemu.cpu.block_scaled.gemm_chain_operands`); returns numpy fp32 [M, N], NaN canonical."""
    gemm = BlockScaledGemm(a_codes, b_codes, fmt_a, fmt_b, scale_a, scale_b, scale_fmt, preset)
    M, N, K = gemm.shape
    out = np.zeros((M, N), np.float32)
    if 0 in (M, N, K):
        return out
    ops = gemm_chain_operands(gemm)
    d_b = ChainOperand(*(cuda.to_device(field) for field in ops.b.rows(0, N)))
    step = MAX_GRID_Y * BLOCK
    for r0 in range(0, M, step):
        r1 = min(M, r0 + step)
        d_a = ChainOperand(*(cuda.to_device(field) for field in ops.a.rows(r0, r1)))
        d_out = cuda.to_device(out[r0:r1])
        grid = ((N + BLOCK - 1) // BLOCK, (r1 - r0 + BLOCK - 1) // BLOCK)
        gemm_scaled_simple[grid, (BLOCK, BLOCK)](*d_a, *d_b, ops.k, ops.block, ops.params, ops.group, d_out)
        out[r0:r1] = d_out.copy_to_host()
    return canonical_nan(out)


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

"""The chunked reference kernels (:mod:`mmaemu.model.chunked`, block-wise FP8) on CUDA: ``cuda:simple`` only.

:func:`gemm_chunked_simple` is one thread per output calling
:func:`mmaemu.arith.scaled.accumulate_chunked_one`, the function the CPU reference engine runs, on the output's
decoded row of A and row of B in global memory. The fused multiply-add of the combine is the GPU's ``fma.rn.f32``
(libdevice ``__nv_fmaf_rn``, registered below as the CUDA overload of :func:`mmaemu.arith.scaled.fma_nearest`; the
CPU and the simulator run its exact float64 emulation: the same IEEE operation, the same bits).

``cuda:offset`` and ``cuda:native`` decline (:func:`chunked_decline`, their reasons in the kernel registry,
:mod:`mmaemu.cuda.catalog`): the offset kernel folds every product into one fp32 accumulator per output with no
chunk boundary at which a scaled combine could enter, and the native kernel is gated for cuBLASLt's chains only.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ... import formats
from ...arith import scaled as _scaled
from ...arith.params import BlockParams, preset_params
from ...model.presets import get_preset
from .. import catalog, shim
from ..simple.kernels import BLOCK, MAX_GRID_Y

shim.restore_numpy_row_stack()
shim.install_builtin_minmax()

_FMA_INSTALLED = False


def install_fma_nearest():
    """Compile :func:`mmaemu.arith.scaled.fma_nearest` to the GPU's ``fma.rn.f32`` (libdevice ``__nv_fmaf_rn``) in
    CUDA kernels; the emulation stays everywhere else (CPU, simulator)."""
    global _FMA_INSTALLED
    if _FMA_INSTALLED or shim.simulator_enabled():
        return
    shim.overload_fp32_fma(_scaled.fma_nearest, "fmaf_rn")
    _FMA_INSTALLED = True


install_fma_nearest()
accumulate_chunked_one = shim.device(_scaled.accumulate_chunked_one)

def chunked_decline(backend: str):
    """Why a CUDA backend does not compute a chunked kernel: the decline rule of the block-wise recipe, from the
    kernel registry (:mod:`mmaemu.cuda.catalog`: the kernels that answer to the name, and the reason another kernel
    gives). None for ``cuda:simple``, whose :func:`gemm_chunked_simple` computes every chunked kernel."""
    name = backend.split(":", 1)[1] if ":" in backend else "cuda"
    if name in catalog.answering(catalog.BLOCKWISE):
        return None
    served = ", ".join(f"cuda:{n}" for n in catalog.answering(catalog.BLOCKWISE))
    return catalog.recipe_decline(name, catalog.BLOCKWISE) or \
        f"only {served} computes block-wise kernels ({name!r} is not one of them)"


@cuda.jit(fastmath=False)
def gemm_chunked_simple(sa, ea, sb, eb, a_codes, b_codes, a_table, b_table, scales_a, scales_b, chunk, rule,
                        params, out):
    """out[m, n] = accumulate_chunked_one(row m of A, row n of B): one thread per output."""
    n, m = cuda.grid(2)
    if m < out.shape[0] and n < out.shape[1]:
        out[m, n] = accumulate_chunked_one(sa[m], ea[m], sb[n], eb[n], a_codes[m], b_codes[n], a_table, b_table,
                                           sa.shape[1], scales_a[m], scales_b[n], chunk, rule, params)


def accumulate_chunked_numpy(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel):
    """Like :func:`mmaemu.cpu.chunked.accumulate_chunked_codes`, computed by :func:`gemm_chunked_simple`
    (operands decoded on the host; runs on a device or under the simulator)."""
    a_codes = np.ascontiguousarray(a_codes, dtype=np.uint8)
    b_codes = np.ascontiguousarray(b_codes, dtype=np.uint8)
    (M, K), N = a_codes.shape, b_codes.shape[0]
    out = np.zeros((M, N), np.float32)
    if M == 0 or N == 0 or K == 0:
        return out
    chunks = -(-K // kernel.chunk)
    scales_a = np.ascontiguousarray(scales_a, dtype=np.float32).reshape(M, chunks)
    scales_b = np.ascontiguousarray(scales_b, dtype=np.float32).reshape(N, chunks)
    params = BlockParams(*(int(v) for v in preset_params(get_preset(kernel.preset), fmt_a, fmt_b)))
    sig_a, exp_a = formats.significands(fmt_a)[a_codes], formats.exponents(fmt_a)[a_codes]
    sig_b, exp_b = formats.significands(fmt_b)[b_codes], formats.exponents(fmt_b)[b_codes]
    tables = [cuda.to_device(np.array(formats.values(fmt))) for fmt in (fmt_a, fmt_b)]
    d_sb, d_eb, d_cb = cuda.to_device(sig_b), cuda.to_device(exp_b), cuda.to_device(b_codes)
    d_scb = cuda.to_device(scales_b)
    step = MAX_GRID_Y * BLOCK
    for r0 in range(0, M, step):
        r1 = min(M, r0 + step)
        d_out = cuda.to_device(out[r0:r1])
        grid = ((N + BLOCK - 1) // BLOCK, (r1 - r0 + BLOCK - 1) // BLOCK)
        gemm_chunked_simple[grid, (BLOCK, BLOCK)](
            cuda.to_device(np.ascontiguousarray(sig_a[r0:r1])), cuda.to_device(np.ascontiguousarray(exp_a[r0:r1])),
            d_sb, d_eb, cuda.to_device(np.ascontiguousarray(a_codes[r0:r1])), d_cb, tables[0], tables[1],
            cuda.to_device(np.ascontiguousarray(scales_a[r0:r1])), d_scb, int(kernel.chunk), int(kernel.combine),
            params, d_out)
        out[r0:r1] = d_out.copy_to_host()
    return out

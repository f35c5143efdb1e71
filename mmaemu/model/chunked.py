"""Reference kernels that accumulate in scaled chunks, as data (design note scaling-recipes.md sections 1, 3).

A :class:`ChunkedKernel` is a record: the preset of its tensor-core chains, the chunk length, the combine rule
(:mod:`mmaemu.arith.scaled`), the output step, the split policy and where its rules come from. The engines
(:mod:`mmaemu.cpu.chunked`, :mod:`mmaemu.cuda.blockwise.kernel`) take the record and run the same arithmetic for every
kernel; a new kernel of this family is one more entry of :data:`CHUNKED_KERNELS`.
"""

from __future__ import annotations

import dataclasses

from ..arith.scaled import COMBINE_SCALED_FMA, OUTPUT_BFLOAT16, OUTPUT_REDUCE_ADD_FP32

DEEPGEMM_SOURCE = ("deepseek-ai/DeepGEMM v2.1.1.post3 (commit c9f8b34dcdacc20aa746b786f983492c51072870): "
                   "csrc/apis/gemm.hpp, csrc/jit_kernels/impls/sm90_fp8_gemm_1d2d.hpp and sm90_fp8_gemm_1d1d.hpp, "
                   "deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh and sm90_fp8_gemm_1d1d.cuh")


@dataclasses.dataclass(frozen=True)
class ChunkedKernel:
    """One chunked reference kernel.

    * ``preset``: the tensor-core preset of each chunk's chain (``hopper``: wgmma k32, 32-product blocks);
    * ``chunk``: products per chunk (a multiple of the preset's nfma, so no block straddles two chunks);
    * ``combine``: :data:`mmaemu.arith.scaled.COMBINE_ADD` or ``COMBINE_SCALED_FMA``;
    * ``output``: :data:`mmaemu.arith.scaled.OUTPUT_BFLOAT16` or ``OUTPUT_REDUCE_ADD_FP32``;
    * ``splitk``: "none": every output is one CTA's loop over all chunks, so its bits do not depend on the GPU's
      SM count or on the other outputs;
    * ``maturity``, ``source``: the evidence (modelled from pinned source, not recorded on hardware).
    """

    name: str
    preset: str
    chunk: int
    combine: int
    output: int
    splitk: str
    maturity: str
    source: str


DEEPGEMM_SM90_1D2D = ChunkedKernel(
    name="deepgemm sm90_fp8_gemm_1d2d", preset="hopper", chunk=128, combine=COMBINE_SCALED_FMA,
    output=OUTPUT_BFLOAT16, splitk="none", maturity="experimental", source=DEEPGEMM_SOURCE)
DEEPGEMM_SM90_1D1D = ChunkedKernel(
    name="deepgemm sm90_fp8_gemm_1d1d", preset="hopper", chunk=128, combine=COMBINE_SCALED_FMA,
    output=OUTPUT_REDUCE_ADD_FP32, splitk="none", maturity="experimental", source=DEEPGEMM_SOURCE)

CHUNKED_KERNELS = {kernel.name: kernel for kernel in (DEEPGEMM_SM90_1D2D, DEEPGEMM_SM90_1D1D)}

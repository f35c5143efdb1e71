"""Reference kernels that accumulate in scaled chunks, as data (design note scaling-recipes.md sections 1, 3).

A :class:`ChunkedKernel` is a record: the preset of its tensor-core chains, the chunk length, the combine rule
(:mod:`mmaemu.arith.scaled`), the output step, the split policy and where its rules come from. The engines
(:mod:`mmaemu.cpu.chunked`, :mod:`mmaemu.cuda.blockwise.kernel`) take the record and run the same arithmetic for every
kernel; a new kernel of this family is one more entry of :data:`CHUNKED_KERNELS`.
"""

from __future__ import annotations

import dataclasses

from ..arith.scaled import (COMBINE_FMA_SCALE_A_FIRST, COMBINE_FMA_SCALE_B_FIRST, COMBINE_SCALED_FMA, OUTPUT_BFLOAT16,
                            OUTPUT_REDUCE_ADD_FP32)
from .presets import Preset, get_preset

DEEPGEMM_SOURCE = ("deepseek-ai/DeepGEMM v2.1.1.post3 (commit c9f8b34dcdacc20aa746b786f983492c51072870): "
                   "csrc/apis/gemm.hpp, csrc/jit_kernels/impls/sm90_fp8_gemm_1d2d.hpp and sm90_fp8_gemm_1d1d.hpp, "
                   "deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh and sm90_fp8_gemm_1d1d.cuh")
# The public zero-tolerance reference of cuBLASLt's sm_90 block-wise kernels (VEC128_32F / BLK128x128_32F scales):
# Transformer Engine's CuBLASRefBlockwiseGemm, checked with atol = rtol = 0 against cuBLASLt by its tests.
CUBLASLT_SOURCE = ("NVIDIA/TransformerEngine tests/pytorch/references/blockwise_fp8_gemm_reference.py "
                   "(CuBLASRefBlockwiseGemm, stored version 7d5b5d99865501923613f11ba37da30141818a30), checked with "
                   "atol=0, rtol=0 against cuBLASLt by tests/pytorch/test_float8_blockwise_gemm_exact.py (stored "
                   "version 03328ccb9aa9933fac05bcaf8e0b5772eca75965)")


@dataclasses.dataclass(frozen=True)
class ChunkedKernel:
    """One chunked reference kernel.

    * ``preset``: the tensor-core preset of each chunk's chain (``hopper``: wgmma k32, 32-product blocks);
    * ``chunk``: products per chunk (a multiple of the preset's nfma, so no block straddles two chunks);
    * ``combine``: a combine rule of :mod:`mmaemu.arith.scaled` (``COMBINE_ADD``, ``COMBINE_SCALED_FMA``,
      ``COMBINE_FMA_SCALE_A_FIRST``, ``COMBINE_FMA_SCALE_B_FIRST``);
    * ``output``: an output mode of :mod:`mmaemu.arith.scaled` (``OUTPUT_BFLOAT16``, ``OUTPUT_REDUCE_ADD_FP32``,
      ``OUTPUT_FLOAT32``, ``OUTPUT_ADD_BFLOAT16``, each with ``OUTPUT_ACCUMULATE_FLAG`` or not); a call may replace
      it (``dataclasses.replace``) by the one its output dtype, bias and accumulation need;
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

    @property
    def tensor_core_preset(self) -> Preset:
        """The :class:`~mmaemu.model.presets.Preset` named by ``preset`` (the engines take it from the record, so
        that they need not look presets up themselves)."""
        return get_preset(self.preset)


DEEPGEMM_SM90_1D2D = ChunkedKernel(
    name="deepgemm sm90_fp8_gemm_1d2d", preset="hopper", chunk=128, combine=COMBINE_SCALED_FMA,
    output=OUTPUT_BFLOAT16, splitk="none", maturity="experimental", source=DEEPGEMM_SOURCE)
DEEPGEMM_SM90_1D1D = ChunkedKernel(
    name="deepgemm sm90_fp8_gemm_1d1d", preset="hopper", chunk=128, combine=COMBINE_SCALED_FMA,
    output=OUTPUT_REDUCE_ADD_FP32, splitk="none", maturity="experimental", source=DEEPGEMM_SOURCE)


def _cublaslt(pair: str, combine: int) -> ChunkedKernel:
    return ChunkedKernel(name=f"cublaslt sm90 block-wise {pair}", preset="hopper", chunk=128, combine=combine,
                         output=OUTPUT_BFLOAT16, splitk="none", maturity="experimental", source=CUBLASLT_SOURCE)


# cuBLASLt's block-wise kernels by (block of A's scales, block of B's scales), in torch's terms (A = mat_a [M, K],
# B = mat_b [K, N]); 128x128 x 128x128 does not exist (cuBLASLt and torch refuse it).
CUBLASLT_SM90_1X128_1X128 = _cublaslt("1x128 x 1x128", COMBINE_FMA_SCALE_A_FIRST)
CUBLASLT_SM90_1X128_128X128 = _cublaslt("1x128 x 128x128", COMBINE_FMA_SCALE_A_FIRST)
CUBLASLT_SM90_128X128_1X128 = _cublaslt("128x128 x 1x128", COMBINE_FMA_SCALE_B_FIRST)
CUBLASLT_BLOCKWISE = {((1, 128), (1, 128)): CUBLASLT_SM90_1X128_1X128,
                      ((1, 128), (128, 128)): CUBLASLT_SM90_1X128_128X128,
                      ((128, 128), (1, 128)): CUBLASLT_SM90_128X128_1X128}

CHUNKED_KERNELS = {kernel.name: kernel for kernel in (DEEPGEMM_SM90_1D2D, DEEPGEMM_SM90_1D1D,
                                                      *CUBLASLT_BLOCKWISE.values())}

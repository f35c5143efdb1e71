"""The B200 block-scaled GEMM of ``torch._scaled_mm`` (MXFP8, MXFP4 and NVFP4) as data: the profile that models
it, which instruction computes each recipe, and everything the public sources leave open.

torch hands an MXFP8 call (float8 operands, ``float8_e8m0fnu`` scales, one per 32 elements of K), an MXFP4 call
(``float4_e2m1fn_x2`` operands, ``float8_e8m0fnu`` scales, one per 32) or an NVFP4 call (``float4_e2m1fn_x2``
operands, ``float8_e4m3fn`` scales read as UE4M3, one per 16) to its GEMM with the scales in the swizzled 32_4_4
layout (:mod:`mmaemu.scale_layout`). Which kernel (pytorch/pytorch ``aten/src/ATen/native/cuda/ScaledBlas.cpp`` at
commits 0174dfabc023f11a8f78c79c301b49c8d7e02c8b and 2bec3bdfd540b2e6271cd06a44639c2967fd6417):
``torch._scaled_mm`` sends every block-scaled call (``BlockWise1x32`` for float8 or packed FP4 operands with
``float8_e8m0fnu`` scales, ``BlockWise1x16`` for NVFP4) to ``_scaled_gemm``, i.e. cuBLASLt
(``at::cuda::blas::scaled_gemm``), bias included; ``torch._scaled_mm_v2`` (``F.scaled_mm``) sends MXFP8 and NVFP4
there too, but MXFP4 to FBGEMM GenAI's CUTLASS kernel ``f4f4bf16`` (``_scaled_mxfp4_mxfp4``; refused with
NotImplementedError in a build without FBGEMM GenAI / MSLK), which gets no bias and writes bf16
(pytorch/FBGEMM ``fbgemm_gpu/experimental/gen_ai/src/quantize/cutlass_extensions/f4f4bf16/f4f4bf16_common.cuh`` at
471f00416c5e2181a871c82f951aa7ac9ce315b4: epilogue alpha = 1, beta = 0, no split-K). torch 2.13.0 (git
cf30153c4c131c8164ee7798e5022d810682e2cb; its source is not stored here) lies between the two commits by its
headers (``ATen/BlasBackend.h`` without 0174dfab's ROCm-only ``BlockWiseBlk32Ue8m0_32_8_EXT``,
``ATen/native/ScaledBlasUtils.h`` with ``MXFP4_MXFP4``, ``USE_MSLK``), and both agree on all of the above.

On a B200 the GEMMs run ``tcgen05.mma`` with ``kind::mxf8f6f4`` (MXFP8), ``kind::mxf4`` (MXFP4) or
``kind::mxf4nvf4`` (NVFP4); the instructions are modelled after MMA-Sim 2.1.1 (presets ``tcgen05_mxf8f6f4`` and
``tcgen05_mxf4nvf4``, which computes kind::mxf4 as MMA-Sim does: its block-32 UE8M0 case). For MXFP4 CUTLASS's
instruction choice is pinned (NVIDIA/cutlass ``include/cutlass/gemm/collective/builders/sm1xx_common.inl`` at
41c55641c6ff64a64e284e82853638676c996040, ``blockscaled::select_instr``: with the automatic schedule, FP4 x FP4
operands both K-major -- f4f4bf16's row-major A and column-major B -- take ``MXF4_NVF4``, i.e. kind::mxf4 for
UE8M0 block-32 scales; kind::mxf8f6f4 only for other layouts); cuBLASLt's is not public and is modelled as the same.
A profile made from ``tcgen05_mxf8f6f4`` (:func:`mmaemu.profile_from_preset`) computes MXFP4 with FP4 operands of
kind::mxf8f6f4 instead.

The GEMM around the instructions is modelled, experimentally, as one chain of the instruction per output along K
from +0 (the accumulator stays in tensor memory: no promotion to CUDA-core adds, no split-K), then the epilogue:
``D = alpha * acc`` rounded once to the output dtype, alpha = 1, or for NVFP4's two-level scaling alpha =
fp32(global_scale_a * global_scale_b) (torch's ``_scaled_nvfp4_nvfp4``: ``alpha = global_scale_a.mul(global_scale_b)``),
applied as the tensor-wise epilogue of semantics.md (e) applies scale_a * scale_b.

K that is not a whole number of 64-element FP4 instructions (torch takes every K with K / 2 a multiple of 16, so
K % 64 == 32 reaches the kernel: torchao's NVFP4 shapes K = 96 and 160 run on a B200): the last instruction is
modelled as zero-padded -- the elements beyond K are +0 (the out-of-bounds fill of the TMA loads the CUTLASS
kernels use; cuBLASLt's is not public) and the scales of the padded blocks are the codes the swizzled scale tensor
holds in its padding columns (the kernel reads the whole 4-column scale atom). A padded group of zero products
takes part in no alignment (semantics.md b.5), so any finite padding scale gives the bits of the K elements alone
(tests/test_block_scaled_scaled_mm.py shows it on MMA-Sim's model); a NaN padding scale would make the instruction
NaN in MMA-Sim's model, and whether the kernel reads it is not known: refused (:func:`padding_scale_refusal`).

Unknown (no recording; the B200 probes in docs/limitations.md would decide): whether the block-scaled kernels split
K or promote partial sums at some K (slow accumulation), whether ``use_fast_accum`` changes anything for MXFP8 (it
is computed the same either way here; torch refuses it for FP4), how alpha and the output rounding are applied,
which instruction cuBLASLt runs for MXFP4 and mixed FP8 x FP4 calls (mixed: refused), how the zero padding of a
partial last FP4 instruction treats its scales, and the fused bias epilogue (cuBLASLt's ``CUBLASLT_EPILOGUE_BIAS``
is closed source: refused, :data:`BIAS_REFUSAL`).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

__all__ = ["PROFILE", "KERNEL", "BlockScaledFormat", "RECIPES", "recipe_preset", "is_block_scaled_profile",
           "NO_SPLIT_REASON",
           "UNKNOWNS", "unknowns", "maturity_message", "padded_K", "padding_scale_refusal", "BIAS_REFUSAL"]

#: The built-in profile of the B200 block-scaled GEMMs.
PROFILE = "b200-mx-experimental"
KERNEL = "cuBLASLt block-scaled (B200 tcgen05.mma block_scale)"
#: The probe of docs/limitations.md that would decide the bias epilogue.
BIAS_PROBE = "the B200 block-scaled bias probe"
BIAS_REFUSAL = ("a bias is not modelled: torch's _scaled_mm hands it to cuBLASLt's fused bias epilogue "
                "(CUBLASLT_EPILOGUE_BIAS), whose order of alpha, bias and output rounding no public source gives "
                f"({BIAS_PROBE} in docs/limitations.md would decide it); call without bias and add it to the result "
                "yourself")
# cuda:simple's block-scaled kernel is an explicit choice with no device self-test (the row-wise epilogue stays on
# the CPU for the same reason): it computes, and says so once per process.
CUDA_SIMPLE_UNCHECKED = ("mmaemu: cuda:simple computes this block-scaled call with a kernel that has no device "
                         "self-test (checked under the CUDA simulator only): its bits on this GPU are not verified; "
                         "backend='cpu' computes the same call on the CPU (docs/limitations.md)")
NO_SPLIT_REASON = ("modelled as one chain of the instruction per output over all of K (no split-K, no promotion): "
                   "not recorded on a B200")
UNKNOWNS = ("split-K and slow accumulation of cuBLASLt's block-scaled kernels", "the effect of use_fast_accum on "
            "MXFP8", "alpha's and the output's rounding in the epilogue")
# Said only by an MXFP4 call, and by a call whose last FP4 instruction is zero-padded.
MXFP4_UNKNOWN = "the instruction cuBLASLt runs for MXFP4 (modelled as CUTLASS's kind::mxf4)"
PADDING_UNKNOWN = "the zero padding of the last instruction (K % 64 == 32)"


class BlockScaledFormat(NamedTuple):
    """One format of the block-scaled recipe (MXFP8, MXFP4, NVFP4; not a :class:`mmaemu.recipes.base.Recipe`, which is
    the whole recipe), one variant of ``_scaled_mm`` (:mod:`mmaemu.recipes.block_scaled`): operand
    dtypes (the first is the one its casts produce), scale dtype and format, block length (elements of K per
    scale), the instruction preset of the B200 profile, and the multiple of K (elements) a call and a layer's
    in_features need: one 32-element MXFP8 instruction, or torch's packed-FP4 rule (K / 2 a multiple of 16)."""

    name: str
    operand_dtypes: tuple
    scale_dtype: str
    scale_fmt: str
    block: int
    preset: str
    k_multiple: int


#: The one table of the block-scaled variants: validation (:mod:`mmaemu.plan.block_scaled`), the casts
#: (:mod:`mmaemu.block_quantize`) and the layers (:mod:`mmaemu.nn_recipes`) read it.
RECIPES = {
    "mxfp8": BlockScaledFormat("mxfp8", ("float8_e4m3fn", "float8_e5m2"), "float8_e8m0fnu", "ue8m0", 32,
                               "tcgen05_mxf8f6f4", 32),
    "mxfp4": BlockScaledFormat("mxfp4", ("float4_e2m1fn_x2",), "float8_e8m0fnu", "ue8m0", 32, "tcgen05_mxf4nvf4", 32),
    "nvfp4": BlockScaledFormat("nvfp4", ("float4_e2m1fn_x2",), "float8_e4m3fn", "ue4m3", 16, "tcgen05_mxf4nvf4", 32),
}
FP4_RECIPES = tuple(name for name, row in RECIPES.items() if "float4_e2m1fn_x2" in row.operand_dtypes)


def is_block_scaled_profile(profile) -> bool:
    """Whether ``profile`` computes block-scaled calls: the built-in B200 profile, or a profile whose preset is a
    block-scaled instruction (:func:`mmaemu.profile_from_preset`)."""
    return profile.name == PROFILE or bool(getattr(_preset_of(profile), "block_scaled", False))


def _preset_of(profile):
    from ..model.presets import get_preset

    return get_preset(profile.preset, warn=False)


def recipe_preset(profile, recipe: BlockScaledFormat):
    """The instruction preset that computes ``recipe`` on ``profile``, or None if the profile has none for it.

    The B200 profile: the recipe's own preset. A profile made from a block-scaled preset: that preset when it takes
    the recipe's operands and scales (a ``kind::mxf8f6f4`` preset for MXFP8, and for MXFP4 with FP4 operands of
    kind::mxf8f6f4; a ``kind::mxf4nvf4`` one for NVFP4 and MXFP4).
    """
    from ..model.presets import get_preset

    preset = _preset_of(profile)
    if profile.name == PROFILE:
        return get_preset(recipe.preset, warn=False)
    fmt = "e2m1" if recipe.name in FP4_RECIPES else "e4m3"
    if preset.block_scaled and fmt in preset.operand_formats and (recipe.block, recipe.scale_fmt) in \
            preset.scale_kinds:
        return preset
    return None


def padded_K(K: int, preset) -> int:
    """K in elements rounded up to a whole number of ``preset``'s instructions: the K the kernel computes, the
    last instruction zero-padded (module docstring). Only the 64-element FP4 instructions pad (torch's K is a
    multiple of 32 there); a K that is not a whole number of 32-element instructions stays as it is (refused)."""
    if preset.group and K % 32 == 0:
        return -(-K // preset.nfma) * preset.nfma
    return K


def padding_scale_refusal(recipe: BlockScaledFormat, K: int, K_padded: int) -> str:
    """The refusal of a padded call whose scale padding (the blocks in [K, K_padded)) holds a NaN code."""
    return (f"{recipe.name.upper()} scaled_mm with K = {K}: the last {recipe.preset} instruction is zero-padded to "
            f"K = {K_padded}, and the swizzled scale tensor holds a NaN code in the padding column(s) of blocks "
            f"{K // recipe.block}..{K_padded // recipe.block - 1}, the scales of that padding: whether the kernel "
            "reads them is not known (a NaN scale makes the instruction NaN in MMA-Sim's model); zero the padding "
            "of the scale tensor (mmaemu.scale_layout.to_blocked and torchao's to_blocked pad with zeros)")


def unknowns(recipe: BlockScaledFormat, padded: bool = False) -> tuple:
    """What no source fixes for a call of ``recipe`` (``padded``: its last instruction is zero-padded)."""
    return UNKNOWNS + ((MXFP4_UNKNOWN,) if recipe.name == "mxfp4" else ()) + ((PADDING_UNKNOWN,) if padded else ())


def maturity_message(recipe: BlockScaledFormat, preset_name: str, padded: bool = False) -> str:
    """The ExperimentalPresetWarning text of a block-scaled call (``padded`` as for :func:`unknowns`)."""
    return (f"mmaemu: {recipe.name.upper()} scaled_mm on profile {PROFILE!r} is experimental: instruction "
            f"{preset_name!r} as MMA-Sim 2.1.1 models it, one chain per output (modelled, not recorded); unknown: "
            f"{'; '.join(unknowns(recipe, padded))} (docs/limitations.md)")


def refusal(profile) -> Optional[str]:
    """Why ``profile`` cannot compute a block-scaled call (None if it can)."""
    if is_block_scaled_profile(profile):
        return None
    return (f"profile {profile.name!r} models no block-scaled GEMM (MXFP8/MXFP4/NVFP4 _scaled_mm runs on "
            f"sm_100 only); use profile={PROFILE!r}")

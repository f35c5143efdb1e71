"""The B200 block-scaled GEMM of ``torch._scaled_mm`` (MXFP8 and NVFP4 through cuBLASLt) as data: the profile
that models it, which instruction computes each recipe, and everything the public sources leave open.

torch hands an MXFP8 call (float8 operands, ``float8_e8m0fnu`` scales, one per 32 elements of K) or an NVFP4 call
(``float4_e2m1fn_x2`` operands, ``float8_e4m3fn`` scales read as UE4M3, one per 16) to cuBLASLt with the scales in
the swizzled 32_4_4 layout (:mod:`mmaemu.scale_layout`). On a B200 cuBLASLt runs ``tcgen05.mma`` with
``kind::mxf8f6f4`` (MXFP8) or ``kind::mxf4nvf4`` (NVFP4); the instructions are modelled after MMA-Sim 2.1.1
(presets ``tcgen05_mxf8f6f4`` and ``tcgen05_mxf4nvf4``). The GEMM around them is modelled, experimentally, as one
chain of the instruction per output along K from +0 (the accumulator stays in tensor memory: no promotion to
CUDA-core adds, no split-K), then cuBLASLt's epilogue: ``D = alpha * acc`` rounded once to the output dtype, alpha
= 1, or for NVFP4's two-level scaling alpha = fp32(global_scale_a * global_scale_b) (torch's
``_scaled_nvfp4_nvfp4``: ``alpha = global_scale_a.mul(global_scale_b)``), applied as the tensor-wise epilogue of
semantics.md (e) applies scale_a * scale_b.

Unknown (no recording; the B200 probes in docs/limitations.md would decide): whether cuBLASLt's block-scaled
kernels split K or promote partial sums at some K (slow accumulation), whether ``use_fast_accum`` changes anything
for MXFP8 (it is computed the same either way here; torch refuses it for FP4), how alpha and the output rounding
are applied, and which instruction an MXFP4 call (FP4 with UE8M0 scales) or a mixed FP8 x FP4 call runs (refused).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

__all__ = ["PROFILE", "KERNEL", "Recipe", "RECIPES", "recipe_preset", "is_block_scaled_profile", "NO_SPLIT_REASON",
           "UNKNOWNS", "maturity_message"]

#: The built-in profile of the B200 block-scaled GEMMs.
PROFILE = "b200-mx-experimental"
KERNEL = "cuBLASLt block-scaled (B200 tcgen05.mma block_scale)"
# cuda:simple's block-scaled kernel is an explicit choice with no device self-test (the row-wise epilogue stays on
# the CPU for the same reason): it computes, and says so once per process.
CUDA_SIMPLE_UNCHECKED = ("mmaemu: cuda:simple computes this block-scaled call with a kernel that has no device "
                         "self-test (checked under the CUDA simulator only): its bits on this GPU are not verified; "
                         "backend='cpu' computes the same call on the CPU (docs/limitations.md)")
NO_SPLIT_REASON = ("modelled as one chain of the instruction per output over all of K (no split-K, no promotion): "
                   "not recorded on a B200")
UNKNOWNS = ("split-K and slow accumulation of cuBLASLt's block-scaled kernels", "the effect of use_fast_accum on "
            "MXFP8", "alpha's and the output's rounding in the epilogue", "the instruction of MXFP4 and mixed "
            "FP8 x FP4 calls")


class Recipe(NamedTuple):
    """One block-scaled recipe of ``_scaled_mm``: operand dtypes, scale dtype and format, block length, the
    instruction preset of the B200 profile."""

    name: str
    operand_dtypes: tuple
    scale_dtype: str
    scale_fmt: str
    block: int
    preset: str


RECIPES = {
    "mxfp8": Recipe("mxfp8", ("float8_e4m3fn", "float8_e5m2"), "float8_e8m0fnu", "ue8m0", 32, "tcgen05_mxf8f6f4"),
    "nvfp4": Recipe("nvfp4", ("float4_e2m1fn_x2",), "float8_e4m3fn", "ue4m3", 16, "tcgen05_mxf4nvf4"),
}


def is_block_scaled_profile(profile) -> bool:
    """Whether ``profile`` computes block-scaled calls: the built-in B200 profile, or a profile whose preset is a
    block-scaled instruction (:func:`mmaemu.profile_from_preset`)."""
    return profile.name == PROFILE or bool(getattr(_preset_of(profile), "block_scaled", False))


def _preset_of(profile):
    from ..model.presets import get_preset

    return get_preset(profile.preset, warn=False)


def recipe_preset(profile, recipe: Recipe):
    """The instruction preset that computes ``recipe`` on ``profile``, or None if the profile has none for it.

    The B200 profile: the recipe's own preset. A profile made from a block-scaled preset: that preset when it takes
    the recipe's operands and scales (a ``kind::mxf8f6f4`` preset for MXFP8, a ``kind::mxf4nvf4`` one for NVFP4).
    """
    from ..model.presets import get_preset

    preset = _preset_of(profile)
    if profile.name == PROFILE:
        return get_preset(recipe.preset, warn=False)
    fmt = "e2m1" if recipe.name == "nvfp4" else "e4m3"
    if preset.block_scaled and fmt in preset.operand_formats and (recipe.block, recipe.scale_fmt) in \
            preset.scale_kinds and bool(preset.group) == (recipe.name == "nvfp4"):
        return preset
    return None


def maturity_message(recipe: Recipe, preset_name: str) -> str:
    """The ExperimentalPresetWarning text of a block-scaled call."""
    return (f"mmaemu: {recipe.name.upper()} scaled_mm on profile {PROFILE!r} is experimental: instruction "
            f"{preset_name!r} as MMA-Sim 2.1.1 models it, one chain per output (modelled, not recorded); unknown: "
            f"{'; '.join(UNKNOWNS)} (docs/limitations.md)")


def refusal(profile) -> Optional[str]:
    """Why ``profile`` cannot compute a block-scaled call (None if it can)."""
    if is_block_scaled_profile(profile):
        return None
    return (f"profile {profile.name!r} models no block-scaled GEMM (MXFP8/NVFP4 _scaled_mm runs on sm_100 "
            f"only); use profile={PROFILE!r}")

"""Validation of a block-scaled ``scaled_mm`` call (MXFP8, MXFP4, NVFP4), as torch's ``_scaled_mm`` does it on
sm_100.

Sources, and what was not available: torch 2.7.1's own ``aten/src/ATen/native/cuda/Blas.cpp`` could not be read
here, and its ``_scaled_mm`` has no NVFP4 (FP4 operands with ``float8_e4m3fn`` scales came with torch 2.8). The
rules below are those of the later pytorch/pytorch sources read: ``aten/src/ATen/native/cuda/ScaledBlas.cpp`` at
commit 0174dfabc023f11a8f78c79c301b49c8d7e02c8b (``is_blockwise_1x32_scaling``, ``is_blockwise_1x16_scaling``,
``_scaled_mm_out_cuda``, ``_scaled_nvfp4_nvfp4``), an earlier ``Blas.cpp`` of the same line (the same checks in
the same order, and ``Only multiplication of row-major and column-major matrices is supported by cuBLASLt`` for
every scaling), and ``test/test_scaled_matmul_cuda.py`` (the scale-size rule and the message "For BlockWise
scaling: Expected scale_a size to be ..." that ``_scaled_mm`` raises for MXFP8 and NVFP4). Where the versions word
an error differently (the newest says "Invalid scaling configuration"), the class is the same RuntimeError
(:class:`~mmaemu.errors.ReferenceRejectsError`) and the message here is the test suite's. The layout rule of B.4
is torch's in that Blas.cpp but not in the newest source (which lets Blackwell take every layout): refused as
mmaemu's scope. torch's order, for a call with block scales:

* B.1 (in f.2.4-5, torch's scaling type) both scales of one dtype, ``float8_e8m0fnu`` (one per 32 elements of K)
  or ``float8_e4m3fn`` (one per 16), K = 2 x mat1.size(1) for packed FP4 operands (``is_blockwise_1x32_scaling``'s
  packed-FP4 path and ``is_blockwise_1x16_scaling``): each scale tensor holds
  ``128 * ceil(rows / 128) * 4 * ceil(ceil(K / block) / 4)`` codes (rows = M for scale_a, N for scale_b: the
  padded swizzled layout) -> ``ReferenceRejectsError`` "For BlockWise scaling: Expected scale_a size to be ...";
  both contiguous -> ``ReferenceRejectsError``;
* then torch's common checks (f.2.6-14) with FP4 operands admitted (``Expected mat1 to be Float8 or Float4_x2
  matrix``) and ``use_fast_accum`` refused with FP4 operands, and the zero-size return (f.3).

After f.3 (:func:`check_block_scaled_call`, tags ``[torch _scaled_mm]`` and ``[mmaemu scope]``):

* B.2 the recipe: FP8 operands with UE8M0 scales (MXFP8), FP4 operands with UE8M0 scales (MXFP4) or FP4
  operands with UE4M3 scales (NVFP4); FP8 with UE4M3 scales and mixed FP8 x FP4 -> ``UnsupportedFeatureError``
  (which instruction cuBLASLt runs for them is not known);
* B.3 the platform: the profile must model block-scaled GEMMs (:mod:`mmaemu.platform.block_scaled`) ->
  ``UnsupportedFeatureError``;
* B.4 what is not modelled -> ``UnsupportedFeatureError``: K not a whole number of 32-element instructions
  (MXFP8; FP4 K is always a multiple of 32, and a K % 64 == 32 is computed with the last 64-element instruction
  zero-padded: :func:`mmaemu.platform.block_scaled.padded_K`); input not row-major or mat2 not column-major; an
  out= that is not row-major; an FP8 output (cuBLASLt's D scale and amax); a bias
  (:data:`mmaemu.platform.block_scaled.BIAS_REFUSAL`); global scales with MXFP8 or MXFP4, or only one of them
  (torch: "For two-level-scaled NVFP4, global_scale_a must have a value"); a global scale that is not a tensor
  (TypeError: torch's list of scales takes tensors only) or not one fp32 element; requires_grad under grad mode.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from ..errors import ReferenceRejectsError, UnsupportedFeatureError
from ..platform.block_scaled import (BIAS_REFUSAL, RECIPES, BlockScaledFormat, padded_K, recipe_preset,
                                     refusal)
from .descriptors import dtype_name
from .layout import is_row_major, mat2_is_column_major

__all__ = ["BlockScaling", "block_scaling", "BlockScaledSpec", "check_block_scaled_call", "FP4_DTYPE_NAME"]

_TORCH = "[torch _scaled_mm]"
_SCOPE = "[mmaemu scope]"
FP4_DTYPE_NAME = "float4_e2m1fn_x2"  # by name (torch 2.8's dtype): operand descriptors plan without torch
_SCALE_BLOCK = {row.scale_dtype: row.block for row in RECIPES.values()}  # scale dtype -> block (one per dtype)
_MN_TILE, _K_TILE = 128, 4


class BlockScaling(NamedTuple):
    """The block scaling torch found: scale dtype name, block length, K in elements (FP4 unpacked)."""

    scale_dtype: str
    block: int
    K: int


class BlockScaledSpec(NamedTuple):
    """A checked block-scaled call: the recipe, the preset that computes it, the element formats, K in elements,
    the block length, and the K the kernel computes (``padded_K`` > K: the last instruction zero-padded)."""

    recipe: BlockScaledFormat
    preset: object
    fmt_a: str
    fmt_b: str
    K: int
    block: int
    padded_K: int


def _dtype_name(t) -> str:
    return dtype_name(t.dtype)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def expected_scale_numel(rows: int, K: int, block: int) -> int:
    """Codes of one operand's scale tensor in the padded swizzled layout (torch's size rule)."""
    return _round_up(rows, _MN_TILE) * _round_up(-(-K // block), _K_TILE)


def block_scaling(scale_a, scale_b, input, mat2) -> Optional[BlockScaling]:
    """B.1: the block scaling of the call, or None when the scales are not block scales (torch's other scaling
    types then apply). Raises ReferenceRejectsError for a wrong scale size or a non-contiguous scale."""
    name = _dtype_name(scale_a)
    if name != _dtype_name(scale_b) or name not in _SCALE_BLOCK:
        return None
    block = _SCALE_BLOCK[name]
    M, N = input.shape[0], mat2.shape[1]
    K = input.shape[1] * (2 if _dtype_name(input) == FP4_DTYPE_NAME else 1)  # torch counts K unpacked for FP4
    for label, scale, rows in (("scale_a", scale_a, M), ("scale_b", scale_b, N)):
        expected = expected_scale_numel(rows, K, block)
        if scale.numel() != expected:
            raise ReferenceRejectsError(
                f"For BlockWise scaling: Expected {label} size to be {expected} but got {scale.numel()}: one "
                f"{name} scale per {block} elements of K = {K} for {rows} rows, in the swizzled layout padded to "
                f"128 rows and 4 scale columns (mmaemu.scale_layout.to_blocked) {_TORCH}")
    if not (scale_a.is_contiguous() and scale_b.is_contiguous()):
        raise ReferenceRejectsError(f"For BlockWise scaling: Both scale_a and scale_b must be contiguous; pass "
                                    f"scale.contiguous() {_TORCH}")
    return BlockScaling(name, block, K)


def _scope(message: str) -> UnsupportedFeatureError:
    return UnsupportedFeatureError(f"{message} {_SCOPE}")


def _recipe_of(input, mat2, scaling: BlockScaling) -> BlockScaledFormat:
    """B.2: MXFP8, MXFP4 or NVFP4 by the operand and scale dtypes."""
    dtypes = (_dtype_name(input), _dtype_name(mat2))
    for recipe in RECIPES.values():
        if recipe.scale_dtype == scaling.scale_dtype and all(d in recipe.operand_dtypes for d in dtypes):
            return recipe
    raise _scope(f"block-scaled scaled_mm with operands {dtypes[0]} x {dtypes[1]} and {scaling.scale_dtype} scales: "
                 f"only MXFP8 (float8 operands, float8_e8m0fnu scales), MXFP4 (float4_e2m1fn_x2 operands, "
                 f"float8_e8m0fnu scales) and NVFP4 (float4_e2m1fn_x2 operands, float8_e4m3fn scales) are modelled; "
                 f"which instruction cuBLASLt runs for mixed FP8 x FP4 operands or FP8 with UE4M3 scales is not "
                 f"known")


def _format_of(t) -> str:
    return {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float4_e2m1fn_x2": "e2m1"}[_dtype_name(t)]


def check_block_scaled_call(input, mat2, scaling: BlockScaling, od, bias, out, profile, globals_, grad) -> \
        BlockScaledSpec:
    """B.2-B.4 for a block-scaled call with M, N, K > 0 that passed torch's common checks; ``globals_`` = the
    (global_scale_a, global_scale_b) pair, None for none; ``grad`` = the tensors whose requires_grad is refused."""
    recipe = _recipe_of(input, mat2, scaling)  # B.2
    why = refusal(profile)  # B.3
    if why is not None:
        raise _scope(f"{recipe.name.upper()} scaled_mm: {why}")
    preset = recipe_preset(profile, recipe)
    if preset is None:
        raise _scope(f"{recipe.name.upper()} scaled_mm: profile {profile.name!r} computes block-scaled calls with "
                     f"preset {profile.preset_name!r}, which does not take {recipe.name.upper()} operands and scales")
    K = scaling.K
    K_padded = padded_K(K, preset)
    if K_padded % preset.nfma:  # B.4
        raise _scope(f"{recipe.name.upper()} scaled_mm with K = {K}: K must be a multiple of {preset.nfma} (one "
                     f"{preset.name} instruction takes {preset.nfma} elements of K; how cuBLASLt pads a partial "
                     f"instruction is not known); zero-pad K (and its scales) to a multiple of {preset.nfma}")
    if not is_row_major(input) or not mat2_is_column_major(mat2):
        raise _scope(f"{recipe.name.upper()} scaled_mm needs input row-major [M, K] and mat2 column-major [K, N] "
                     f"(got strides {tuple(input.stride())} and {tuple(mat2.stride())}): other layouts may run "
                     f"other kernels on a B200; pass input.contiguous() and w.t() for a row-major weight w")
    if out is not None and tuple(out.shape) == (input.shape[0], mat2.shape[1]) and not is_row_major(out):
        raise _scope(f"{recipe.name.upper()} scaled_mm: out= must be row-major, got strides {tuple(out.stride())}; "
                     f"pass a contiguous out or out=None")
    if dtype_name(od) not in ("float32", "bfloat16", "float16"):
        raise _scope(f"{recipe.name.upper()} scaled_mm with output dtype {od}: only float32, bfloat16 and float16 "
                     f"outputs are modelled (an FP8 output needs cuBLASLt's D scale and amax)")
    if bias is not None:
        raise _scope(f"{recipe.name.upper()} scaled_mm: {BIAS_REFUSAL}")
    _check_globals(recipe, globals_)
    needing = [name for name, t in grad.items() if t is not None and t.requires_grad]
    if needing:
        import torch

        if torch.is_grad_enabled():
            raise _scope(f"{', '.join(needing)} require(s) grad while grad mode is enabled: mmaemu is inference "
                         f"only; wrap the call in torch.no_grad() or pass .detach()ed tensors")
    return BlockScaledSpec(recipe, preset, _format_of(input), _format_of(mat2), K, scaling.block, K_padded)


def _check_globals(recipe: BlockScaledFormat, globals_) -> None:
    if globals_ is None:
        return
    if recipe.name != "nvfp4":
        raise _scope(f"global scales (scale_a / scale_b given as (block scales, global scale) pairs) belong to "
                     f"two-level NVFP4 only; pass the {recipe.name.upper()} block scales alone")
    import torch  # global scales come with real tensors (NVFP4 calls)

    for label, g in zip(("global_scale_a", "global_scale_b"), globals_):
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"scaled_mm: {label} (the second item of scale_{label[-1]}) must be a one-element "
                            f"float32 tensor, got a Python {type(g).__name__} (torch's list of scales takes "
                            f"tensors only); pass torch.tensor({g!r}, dtype=torch.float32, device=input.device)")
        if g.numel() != 1 or g.dtype != torch.float32:
            raise _scope(f"{label} must be a one-element float32 tensor, got {g.dtype} with {g.numel()} "
                         f"element(s); pass a float32 tensor of one element")


def split_two_level(scale_a, scale_b):
    """``(scale_a, scale_b, global_scales)``: NVFP4's two-level scales given as ``(block scales, global scale)``
    pairs (torch's ``_scaled_mm_v2`` passes each operand's scales as such a list) split into the block scales and
    the pair of global scales; anything else is returned as is with ``global_scales`` None. Only one pair ->
    ReferenceRejectsError (torch: "For two-level-scaled NVFP4, global_scale_b must have a value")."""
    pairs = [isinstance(s, (tuple, list)) for s in (scale_a, scale_b)]
    if not any(pairs):
        return scale_a, scale_b, None
    for label, s, is_pair in (("a", scale_a, pairs[0]), ("b", scale_b, pairs[1])):
        if not is_pair:
            raise ReferenceRejectsError(f"For two-level-scaled NVFP4, global_scale_{label} must have a value: pass "
                                        f"scale_{label} as a (block scales, global scale) pair too {_TORCH}")
        if len(s) != 2:
            raise TypeError(f"scaled_mm: scale_{label} as a sequence must be a (block scales, global scale) pair, "
                            f"got {len(s)} items")
    return scale_a[0], scale_b[0], (scale_a[1], scale_b[1])


class KernelOperands(NamedTuple):
    """What the kernel computes of a checked call: element codes A [M, padded_K] and B [N, padded_K] (uint8, FP4
    unpacked, +0 beyond K) and scale codes [M, padded_K / block], [N, padded_K / block] (the padding blocks as the
    swizzled tensors hold them)."""

    a: object
    b: object
    scale_a: object
    scale_b: object


def kernel_operands(a_codes, b_codes, scale_a, scale_b, spec: BlockScaledSpec) -> KernelOperands:
    """The operands of the kernel (:class:`KernelOperands`) from the element codes [rows, K] and the flat swizzled
    scale codes (numpy uint8). A NaN code in a padding block of a padded call -> UnsupportedFeatureError
    (:func:`mmaemu.platform.block_scaled.padding_scale_refusal`)."""
    import numpy as np

    from ..formats import scale_nan_codes
    from ..platform.block_scaled import padding_scale_refusal
    from ..scale_layout import from_blocked

    blocks, extra = spec.padded_K // spec.block, spec.padded_K - spec.K
    sa = from_blocked(scale_a, a_codes.shape[0], blocks)
    sb = from_blocked(scale_b, b_codes.shape[0], blocks)
    if not extra:
        return KernelOperands(a_codes, b_codes, sa, sb)
    nan = scale_nan_codes(spec.recipe.scale_fmt)
    first = spec.K // spec.block
    if nan[sa[:, first:]].any() or nan[sb[:, first:]].any():
        raise _scope(padding_scale_refusal(spec.recipe, spec.K, spec.padded_K))

    def padded(codes):
        return np.pad(codes, ((0, 0), (0, extra)))

    return KernelOperands(padded(a_codes), padded(b_codes), sa, sb)

"""``F.scaled_mm`` / ``torch._scaled_mm_v2`` (torch >= 2.10) as the profile's reference GPU computes them.

:func:`scaled_mm_v2` takes ``torch.nn.functional.scaled_mm``'s arguments (torch 2.13.0: recipes as
``F.ScalingType``, swizzles as ``F.SwizzleType``, ``contraction_dim``, ``output_dtype``, default bfloat16);
:func:`scaled_mm_v2_op` takes ``torch._scaled_mm_v2``'s (recipes and swizzles as lists of ints, ``out_dtype``
without default: None gives mat_a's dtype). Both find the recipe pair as torch's ``_scaled_mm_cuda_v2_out`` does
(its ``scale_kernel_dispatch`` table: ``aten/src/ATen/native/cuda/ScaledBlas.cpp`` of pytorch/pytorch at
0174dfabc023f11a8f78c79c301b49c8d7e02c8b), look up the kernel the profile's stack runs for it
(:func:`mmaemu.platform.kernel_families.route`) and compute it with that kernel's model:

* tensor-wise, row-wise, MXFP8 and NVFP4 -> :func:`mmaemu.scaled_mm` of the same operands (its validation, split
  decision and epilogue: the v2 call is the same GEMM as the v1 call with these scales, and torch runs both in
  the same kernel);
* 1x128 / 128x128 block-wise -> :func:`_blockwise_1x128`, the one function that computes torch's cuBLASLt
  block-wise recipe (in this build it raises: the recipe is added beside it);
* a pair the stack refuses -> ``ReferenceRejectsError`` (as torch raises there), naming the profiles that compute
  it; a pair whose kernel mmaemu does not model -> ``UnsupportedFeatureError`` with the way out.

``contraction_dim`` other than ``()`` is refused (``UnsupportedFeatureError``): only mat_a's last and mat_b's first
dimension are modelled as K.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch

from .base._untraced import untraced
from .errors import ReferenceRejectsError, UnsupportedFeatureError
from .platform import kernel_families
from .platform.profiles import get_profile, list_profiles

__all__ = ["scaled_mm_v2", "scaled_mm_v2_op", "V2Call", "resolve_v2", "recipe_pair", "refusal_error",
           "SCALING_TYPES", "SWIZZLE_TYPES"]

#: torch's ``ScalingType`` and ``SwizzleType`` values (``at::blas``; F.ScalingType / F.SwizzleType of torch 2.13.0).
SCALING_TYPES = {"TensorWise": 0, "RowWise": 1, "BlockWise1x16": 2, "BlockWise1x32": 3, "BlockWise1x128": 4,
                 "BlockWise128x128": 5}
SWIZZLE_TYPES = {"NO_SWIZZLE": 0, "SWIZZLE_32_4_4": 1}
_T, _ROW, _B16, _B32, _B128, _B128x128 = range(6)
_SWIZZLE_32_4_4 = 1
_TORCH = "[torch _scaled_mm_v2]"

# (recipes of a, recipes of b) -> torch's name of the pair; recipe lists as torch's check_*_recipe take them.
_PAIRS = {
    ((_T,), (_T,)): "tensorwise_tensorwise",
    ((_ROW,), (_ROW,)): "rowwise_rowwise",
    ((_B128,), (_B128x128,)): "block_1x128_128x128",
    ((_B128x128,), (_B128,)): "block_128x128_1x128",
    ((_B128,), (_B128,)): "block_1x128_1x128",
    ((_B32,), (_B32,)): "mxfp8_mxfp8",
    ((_B16, _T), (_B16, _T)): "nvfp4_nvfp4",
    ((_B16,), (_B16,)): "nvfp4_nvfp4_single_scale",
}
# Swizzle arguments torch requires per pair (check_swizzle_lengths): pairs not listed take any.
_SWIZZLES_REQUIRED = {"mxfp8_mxfp8": 1, "nvfp4_nvfp4": 2, "nvfp4_nvfp4_single_scale": 1, "mxfp4_mxfp4": 1}


class V2Call(NamedTuple):
    """A resolved v2 call: torch's recipe pair, the kernel route of the profile's stack, and the arguments of
    :func:`mmaemu.scaled_mm` (``args``: input, mat2, scale_a, scale_b, bias, scale_result, out_dtype,
    use_fast_accum) for the pairs that scaled_mm computes."""

    pair: str
    route: kernel_families.KernelRoute
    args: tuple


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _enum_values(values) -> tuple:
    return tuple(int(getattr(v, "value", v)) for v in values)


def _is_fp4(t) -> bool:
    return str(t.dtype).endswith("float4_e2m1fn_x2")


def recipe_pair(mat_a, mat_b, scale_a: Sequence, recipe_a: Sequence[int], scale_b: Sequence,
                recipe_b: Sequence[int]) -> str:
    """torch's name of the recipe pair of a v2 call (``scale_kernel_dispatch``), from the recipes and, for
    BlockWise1x32, the operand dtype (FP4 operands: MXFP4). No pair -> ReferenceRejectsError (torch: "Invalid
    scaling configuration")."""
    pair = _PAIRS.get((tuple(recipe_a), tuple(recipe_b)))
    if pair == "mxfp8_mxfp8" and (_is_fp4(mat_a) or _is_fp4(mat_b)):
        pair = "mxfp4_mxfp4"
    if pair is None or len(scale_a) != len(recipe_a) or len(scale_b) != len(recipe_b):
        names = {v: k for k, v in SCALING_TYPES.items()}
        raise ReferenceRejectsError(
            f"Invalid scaling configuration: recipes {[names.get(r, r) for r in recipe_a]} x "
            f"{[names.get(r, r) for r in recipe_b]} with {len(scale_a)} and {len(scale_b)} scale tensor(s) are none "
            f"of torch's pairs (TensorWise, RowWise, BlockWise1x128 / 128x128, BlockWise1x32, BlockWise1x16 with "
            f"an optional TensorWise global scale), one scale tensor per recipe {_TORCH}")
    return pair


def _computing_profiles(entry: str, pair: str) -> list:
    """The profiles (built-in and recorded) on whose stack mmaemu computes ``pair`` through ``entry``."""
    return [name for name in list_profiles()
            if kernel_families.route(entry, pair, get_profile(name)).computes]


def refusal_error(entry: str, pair: str, route, profile) -> Exception:
    """The error of a call that ``route`` refuses on ``profile``: ReferenceRejectsError where the stack itself
    refuses it, else UnsupportedFeatureError; both name the profiles that compute the pair (the way out)."""
    stack = (f"profile {profile.name!r} (torch {profile.torch_version}, cuBLASLt {profile.cublaslt_version}, "
             f"sm_{profile.capability[0]}{profile.capability[1]})")
    computing = _computing_profiles(entry, pair)
    if computing:
        way_out = f"profile(s) {computing} compute it"
    else:
        way_out = ("no profile of this mmaemu computes it yet (docs/recipes.md lists the stacks that run it); use "
                   "tensor-wise scales meanwhile")
    text = (f"{entry} with {pair} scales on {stack}: {route.why} (kernel: {route.kernel.name}; "
            f"mmaemu.platform.kernel_families); {way_out}")
    if route.verdict == kernel_families.REFERENCE_REJECTS:
        return ReferenceRejectsError(text)
    return UnsupportedFeatureError(text)


def _check_swizzles(pair: str, swizzle_a: tuple, swizzle_b: tuple) -> None:
    """torch's ``check_swizzle_lengths`` and the MX / NVFP4 kernels' ``SWIZZLE_32_4_4`` requirement."""
    needed = _SWIZZLES_REQUIRED.get(pair)
    if needed is None:
        return
    for label, swizzle in (("swizzle_a", swizzle_a), ("swizzle_b", swizzle_b)):
        if len(swizzle) != needed:
            raise ReferenceRejectsError(f"{label} must have {needed} value{'s' if needed > 1 else ''}, got "
                                        f"{len(swizzle)}: pass SwizzleType.SWIZZLE_32_4_4 for {pair} {_TORCH}")
        if swizzle[0] != _SWIZZLE_32_4_4:
            raise ReferenceRejectsError(f"scale_{label[-1]} must be swizzled to SWIZZLE_32_4_4 format: lay the scales "
                                        f"out with mmaemu.scale_layout.to_blocked and pass SwizzleType.SWIZZLE_32_4_4 "
                                        f"{_TORCH}")


def _scaled_mm_scales(pair: str, scale_a: list, scale_b: list):
    """scale_a and scale_b as :func:`mmaemu.scaled_mm` takes them (NVFP4 two-level: (block, global) pairs)."""
    if pair == "nvfp4_nvfp4":
        return tuple(scale_a), tuple(scale_b)
    return scale_a[0], scale_b[0]


def resolve_v2(mat_a, mat_b, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias, out_dtype,
               contraction_dim=(), use_fast_accum=False, *, profile=None) -> V2Call:
    """The :class:`V2Call` of ``torch._scaled_mm_v2``'s arguments (lists as the op takes them; enums or ints) on
    ``profile``; raises the refusal of a pair the profile's stack does not compute."""
    profile = get_profile(profile)
    scale_a, scale_b = _as_list(scale_a), _as_list(scale_b)
    recipe_a, recipe_b = _enum_values(_as_list(recipe_a)), _enum_values(_as_list(recipe_b))
    swizzle_a, swizzle_b = _enum_values(_as_list(swizzle_a)), _enum_values(_as_list(swizzle_b))
    if tuple(contraction_dim or ()):
        raise UnsupportedFeatureError(
            f"contraction_dim={tuple(contraction_dim)}: only the default (mat_a's last and mat_b's first dimension "
            f"are K) is modelled; pass contraction_dim=() with mat_a [M, K] and mat_b [K, N]")
    pair = recipe_pair(mat_a, mat_b, scale_a, recipe_a, scale_b, recipe_b)
    _check_swizzles(pair, swizzle_a, swizzle_b)
    route = kernel_families.route("scaled_mm", pair, profile)
    if not route.computes:
        raise refusal_error("scaled_mm", pair, route, profile)
    sa, sb = _scaled_mm_scales(pair, scale_a, scale_b)
    return V2Call(pair, route, (mat_a, mat_b, sa, sb, bias, None, out_dtype, bool(use_fast_accum)))


def run_v2(call: V2Call, *, out=None, profile=None, splitk="auto", backend="auto"):
    """Compute a resolved call: block-wise pairs by :func:`_blockwise_1x128`, the others by mmaemu.scaled_mm."""
    if call.pair in kernel_families.BLOCKWISE_PAIRS:
        return _blockwise_1x128(*call.args, pair=call.pair, out=out, profile=profile, splitk=splitk,
                                backend=backend)
    from .api import scaled_mm

    return scaled_mm(*call.args, out=out, profile=profile, splitk=splitk, backend=backend)


def _blockwise_1x128(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, *, pair: str,
                     out=None, profile=None, splitk="auto", backend="auto"):
    """torch's cuBLASLt block-wise recipe (1x128 / 128x128 scales, ``pair`` one of
    :data:`mmaemu.platform.kernel_families.BLOCKWISE_PAIRS`) on a stack that runs it: the one seam every
    block-wise v2 call reaches, computed by :func:`mmaemu.blockwise_cublaslt.scaled_mm_blockwise` (Transformer
    Engine's zero-tolerance reference of cuBLASLt; the scales as F.scaled_mm passes them)."""
    from .blockwise_cublaslt import scaled_mm_blockwise

    if scale_result is not None:
        raise UnsupportedFeatureError(f"scaled_mm with {pair} scales: a scale_result is not modelled for block-wise "
                                      f"scaling (bf16 and fp32 outputs only); drop it")
    block_a, block_b = _BLOCKS_OF_PAIR[pair]
    result = scaled_mm_blockwise(input, mat2, scale_a, scale_b, block_a=block_a, block_b=block_b,
                                 out_dtype=torch.bfloat16 if out_dtype is None else out_dtype, bias=bias,
                                 use_fast_accum=use_fast_accum, profile=profile, splitk=splitk, backend=backend)
    if out is None:
        return result
    out.resize_(result.shape)
    return out.copy_(result)


#: The (scale_a, scale_b) blocks of each block-wise recipe pair.
_BLOCKS_OF_PAIR = {"block_1x128_1x128": ((1, 128), (1, 128)), "block_1x128_128x128": ((1, 128), (128, 128)),
                   "block_128x128_1x128": ((128, 128), (1, 128))}


@untraced
def scaled_mm_v2_op(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias, out_dtype,
                    contraction_dim=(), use_fast_accum=False, *, out=None, profile=None, splitk="auto",
                    backend="auto"):
    """``torch._scaled_mm_v2`` (torch 2.13.0's schema: scales, recipes and swizzles as lists) as the profile's
    reference GPU computes it; ``out=``, ``profile``, ``splitk``, ``backend`` as in :func:`mmaemu.scaled_mm`."""
    call = resolve_v2(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias, out_dtype,
                      contraction_dim, use_fast_accum, profile=profile)
    return run_v2(call, out=out, profile=profile, splitk=splitk, backend=backend)


@untraced
def scaled_mm_v2(mat_a, mat_b, scale_a, scale_recipe_a, scale_b, scale_recipe_b, swizzle_a=None, swizzle_b=None,
                 bias=None, output_dtype: Optional[torch.dtype] = torch.bfloat16, contraction_dim=(),
                 use_fast_accum=False, *, profile=None, splitk="auto", backend="auto"):
    """``torch.nn.functional.scaled_mm`` (torch 2.13.0) as the profile's reference GPU computes it, bit for bit.

    Arguments as F.scaled_mm's: a scale, recipe or swizzle may be one value or a list (NVFP4 two-level: scales
    ``[block_scales, global_scale]`` with recipes ``[BlockWise1x16, TensorWise]``); recipes ``F.ScalingType``
    (or their ints), swizzles ``F.SwizzleType``. The recipe pair decides the kernel (module documentation): for
    the same operands, tensor-wise and row-wise give exactly :func:`mmaemu.scaled_mm`'s bits. ``profile``,
    ``splitk``, ``backend`` as in :func:`mmaemu.scaled_mm`.
    """
    return scaled_mm_v2_op(mat_a, mat_b, scale_a, scale_recipe_a, swizzle_a, scale_b, scale_recipe_b, swizzle_b,
                           bias, output_dtype, contraction_dim, use_fast_accum, profile=profile, splitk=splitk,
                           backend=backend)

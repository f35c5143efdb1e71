"""``F.scaled_grouped_mm`` / ``torch._scaled_grouped_mm(_v2)`` (MoE expert GEMMs) as the profile's reference GPU
computes them: row-wise scales on sm_90, group by group.

Entry points: :func:`scaled_grouped_mm` (``torch.nn.functional.scaled_grouped_mm``'s arguments, torch 2.13.0),
:func:`scaled_grouped_mm_v2_op` (``torch._scaled_grouped_mm_v2``'s: recipe and swizzle lists, ``offs`` before
``bias``) and :func:`scaled_grouped_mm_op` (``torch._scaled_grouped_mm``'s: the recipe read from the scale dtype).

The kernel (pytorch/pytorch ``aten/src/ATen/native/cuda/ScaledGroupMM.cu`` at
017943b70f6920c395e3b6dac100e2cd7ecfa92a, dispatched by ``GroupedBlas.cpp`` at
00d4eaf9327928137f4cc437b17e5cf54623565f): torch's CUTLASS ``f8f8bf16_grouped_mm``, ``GemmUniversal`` in
``kGrouped`` mode, one problem [m_g, n_g, k_g] per group, each output computed by one CTA over all of the
group's K (no split-K, no stream-K). Per group:

* **mainloop**: CUTLASS's sm_90 builder gives FP8 operands of a pointer-array GEMM the FP8 mainloop
  (``MainloopSm90ArrayTmaGmmaWarpSpecializedFP8``, NVIDIA/cutlass ``sm90_gmma_builder.inl``), with the
  ``...FP8FastAccum`` schedules when ``use_fast_accum`` is set: the hopper preset's one chain over K (fast), else
  128-k promotion chunks combined by fp32 adds, as in the non-grouped row-wise kernel
  (:mod:`mmaemu.platform.rowwise`);
* **epilogue**: the tree ``Cast(Multiply(ScaleB, Multiply(ScaleA, Accum)))``: ``bf16(RN(sb[n] * RN(sa[m] *
  acc)))``, every step fp32 round-to-nearest. Unlike the non-grouped kernel there is no bias node (torch refuses a
  bias: "Bias not supported yet") and no transposed dispatch, so scale_a's factor is always applied first and a
  -0 result stays -0. It is computed by the row-wise epilogue arithmetic (:mod:`mmaemu.arith.rowwise`) with a
  bias of -0 at every output, which adds nothing: ``RN(-0 + q) = q`` for every q, -0 and NaN included.

Evidence: the equality of the per-group mainloop with the non-grouped row-wise kernel's is read from source (the
builder's choice), not recorded; the grouped kernel's source is of a newer torch than 2.7.1 (that version's copy
was not read). The model is **experimental** and warns once per process; docs/limitations.md names the probe.

Layouts (torch's checks): mat_a row-major, mat_b column-major in its last two dimensions (``w.transpose(-2,
-1)`` of a [G, N, K] weight); ``offs`` (int32, one end offset per group) splits the 2-D operand(s):
2-D x 3-D: mat_a's rows (scale_a [M_total], scale_b [G, N]); 3-D x 2-D: mat_b's columns; 2-D x 2-D: K (scale_a
[G * M], scale_b [G * N], output [G, M, N]); 3-D x 3-D: no offs (scale_a [G, M], scale_b [G, N]).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

import torch

from .base._untraced import untraced
from .context import for_call
from .errors import ExperimentalPresetWarning, ReferenceRejectsError, UnsupportedFeatureError
from .formats import dtype_name
from .platform import kernel_families
from .platform.profiles import get_profile
from .scaled_v2 import SCALING_TYPES, _as_list, _enum_values, refusal_error
from .warn import Notice, edge, report

__all__ = ["scaled_grouped_mm", "scaled_grouped_mm_v2_op", "scaled_grouped_mm_op", "GroupedCall", "Group",
           "resolve_grouped", "MATURITY_MESSAGE"]

_TORCH = "[torch _scaled_grouped_mm]"
_MAX_GROUPS = 1024
MATURITY_MESSAGE = (
    "mmaemu scaled_grouped_mm (torch's CUTLASS f8f8bf16_grouped_mm on sm_90) is experimental: modelled from pinned "
    "public source (pytorch ScaledGroupMM.cu, GroupedBlas.cpp; NVIDIA CUTLASS's FP8 pointer-array mainloop), not "
    "validated against hardware; docs/limitations.md names the probe that would validate it")


class Group(NamedTuple):
    """One group's problem: a [m, K] row-major and b [K, n] column-major fp8 slices, their fp32 scales sa [m] and
    sb [n], and the output slice ``out`` [m, n] they fill."""

    a: torch.Tensor
    b: torch.Tensor
    sa: torch.Tensor
    sb: torch.Tensor
    out: torch.Tensor


class GroupedCall(NamedTuple):
    """A checked grouped call: torch's recipe pair, the kernel route of the profile's stack, the output tensor
    (to be filled) and the groups."""

    pair: str
    route: kernel_families.KernelRoute
    out: torch.Tensor
    groups: List[Group]


def _rejects(message: str) -> ReferenceRejectsError:
    return ReferenceRejectsError(f"{message} {_TORCH}")


def _check_layouts(mat_a, mat_b) -> None:
    if mat_a.dim() not in (2, 3) or mat_b.dim() not in (2, 3):
        raise _rejects(f"mat_a and mat_b have to be 2 or 3d, got {mat_a.dim()}d and {mat_b.dim()}d")
    if mat_a.stride(-1) != 1:
        raise _rejects(f"Expected mat1 to not be transposed: mat_a must be row-major, got strides "
                       f"{tuple(mat_a.stride())}; pass mat_a.contiguous()")
    if mat_b.stride(-2) != 1:
        raise _rejects(f"Expected mat2 to be transposed: mat_b must be column-major in its last two dimensions, got "
                       f"strides {tuple(mat_b.stride())}; pass w.transpose(-2, -1) of a row-major [G, N, K] weight")
    if not (mat_a.dim() == 2 and mat_b.dim() == 2) and mat_a.size(-1) != mat_b.size(-2):
        raise _rejects(f"contraction dimension of mat_a and mat_b must match: {mat_a.size(-1)} and {mat_b.size(-2)}")
    if mat_a.size(-1) % 16:
        raise _rejects(f"Expected trailing dimension of mat_a to be divisible by 16, got shape {tuple(mat_a.shape)}")
    if mat_b.size(-2) % 16 or mat_b.size(-1) % 16:
        raise _rejects(f"Expected mat_b shape to be divisible by 16, got shape {tuple(mat_b.shape)}")


def _check_offs(mat_a, mat_b, offs) -> None:
    ragged = mat_a.dim() == 2 or mat_b.dim() == 2
    if (offs is not None) != ragged:
        raise _rejects("Have to provide offsets if there is a 2d matrix (and none for 3d x 3d)")
    if offs is not None and (offs.dim() != 1 or offs.dtype != torch.int32):
        raise _rejects(f"offs has to be a 1D int32 tensor, got {offs.dim()}D {offs.dtype}")


def _check_rowwise_scale(mat, scale, dim: int, arg: int, multiplier: int) -> None:
    """torch's ``_check_scales_fp8_rowwise``."""
    if mat.dim() == 2:
        if scale.dim() != 1 or not scale.is_contiguous() or scale.size(0) != mat.size(dim) * multiplier:
            raise _rejects(f"scale for arg {arg} must be a contiguous 1D tensor of {mat.size(dim) * multiplier} "
                           f"elements, got shape {tuple(scale.shape)}")
    elif (scale.dim() != 2 or scale.stride(1) != 1 or scale.size(0) != mat.size(0)
          or scale.size(1) != mat.size(1 + dim)):
        raise _rejects(f"scale for arg {arg} must be a 2D tensor ({mat.size(0)}, {mat.size(1 + dim)}) contiguous in "
                       f"its last dimension, got shape {tuple(scale.shape)}")


def _pair_of_v1(scale_a, scale_b) -> str:
    names = {dtype_name(s.dtype) for s in (scale_a, scale_b)}
    if names == {"float32"}:
        return "rowwise_rowwise"
    if names == {"float8_e8m0fnu"}:
        return "mxfp8_mxfp8"
    raise _rejects("For FP8 tensorwise and rowwise, both scales must both be float32 tensors. For MXFP8, scales "
                   "must both be float8_e8m0fnu tensors.")


_V2_PAIRS = {((1,), (1,)): "rowwise_rowwise", ((3,), (3,)): "mxfp8_mxfp8", ((2, 0), (2, 0)): "nvfp4_nvfp4"}


def _pair_of_v2(recipe_a, recipe_b, mat_a) -> str:
    pair = _V2_PAIRS.get((tuple(recipe_a), tuple(recipe_b)))
    if pair == "mxfp8_mxfp8" and str(mat_a.dtype).endswith("float4_e2m1fn_x2"):
        pair = "mxfp4_mxfp4"
    if pair is None:
        names = {v: k for k, v in SCALING_TYPES.items()}
        raise _rejects(f"No gemm implementation was found for recipes {[names.get(r, r) for r in recipe_a]} x "
                       f"{[names.get(r, r) for r in recipe_b]}: grouped GEMMs take RowWise, BlockWise1x32 (MXFP8) "
                       f"or BlockWise1x16 + TensorWise (NVFP4) scales")
    return pair


def _offsets(offs, length: int, name: str) -> list:
    """(start, end) of each group along a ragged dimension of ``length``; refuses what the GPU leaves unfixed."""
    ends = [int(v) for v in offs.cpu().tolist()]
    if len(ends) >= _MAX_GROUPS:
        raise _rejects(f"Can't process more than 1024 groups, got {len(ends)}")
    starts = [0] + ends[:-1]
    if any(end < start for start, end in zip(starts, ends)) or (ends and ends[-1] > length):
        raise UnsupportedFeatureError(
            f"offs {ends} must be non-decreasing and end at most at {name} = {length}: other offsets make the "
            f"kernel read outside the operand, which the source does not define; pass sorted end offsets")
    if (ends[-1] if ends else 0) != length:
        raise UnsupportedFeatureError(
            f"offs ends at {ends[-1] if ends else 0} but {name} = {length}: torch leaves the rest of the output "
            f"as allocated (not written), which mmaemu does not reproduce; slice the operand to offs[-1]")
    return list(zip(starts, ends))


def _groups(mat_a, mat_b, scale_a, scale_b, offs, device) -> tuple:
    """(output tensor, [Group]) of a row-wise grouped call (module documentation, "Layouts")."""
    bf16 = torch.bfloat16
    if mat_a.dim() == 3 and mat_b.dim() == 3:
        G, M, N = mat_a.size(0), mat_a.size(1), mat_b.size(2)
        out = torch.empty((G, M, N), dtype=bf16, device=device)
        return out, [Group(mat_a[g], mat_b[g], scale_a[g], scale_b[g], out[g]) for g in range(G)]
    if mat_a.dim() == 2 and mat_b.dim() == 3:
        M, N = mat_a.size(0), mat_b.size(2)
        out = torch.empty((M, N), dtype=bf16, device=device)
        spans = _offsets(offs, M, "mat_a.size(0)")
        return out, [Group(mat_a[s:e], mat_b[g], scale_a[s:e], scale_b[g], out[s:e])
                     for g, (s, e) in enumerate(spans)]
    if mat_a.dim() == 3 and mat_b.dim() == 2:
        M, N = mat_a.size(1), mat_b.size(1)
        out = torch.empty((M, N), dtype=bf16, device=device)
        spans = _offsets(offs, N, "mat_b.size(1)")
        _require_aligned(spans, "columns of mat_b")
        return out, [Group(mat_a[g], mat_b[:, s:e], scale_a[g], scale_b[s:e], out[:, s:e])
                     for g, (s, e) in enumerate(spans)]
    M, K, N = mat_a.size(0), mat_a.size(1), mat_b.size(1)
    spans = _offsets(offs, K, "K")
    _require_aligned(spans, "K")
    if any(s == e for s, e in spans):
        raise UnsupportedFeatureError(
            "a group with no K (2-D x 2-D): whether the kernel writes its output (zeros) or leaves it as allocated "
            "is not fixed by the source; drop empty groups")
    out = torch.empty((len(spans), M, N), dtype=bf16, device=device)
    return out, [Group(mat_a[:, s:e], mat_b[s:e], scale_a[g * M:(g + 1) * M], scale_b[g * N:(g + 1) * N], out[g])
                 for g, (s, e) in enumerate(spans)]


def _require_aligned(spans, name: str) -> None:
    """A group's slice along a ragged K or N starts at its offset: the kernel's TMA descriptors need it 16-element
    aligned (16 bytes of fp8), which CUTLASS does not check."""
    if any(s % 16 for s, _ in spans):
        raise UnsupportedFeatureError(
            f"offs {[e for _, e in spans]} along {name}: a group starting off a multiple of 16 is loaded through a "
            f"misaligned TMA descriptor, which the source does not define; pad each group to a multiple of 16")


def resolve_grouped(mat_a, mat_b, scale_a, scale_b, offs, bias, scale_result, out_dtype, pair: str, *,
                    profile=None, context) -> GroupedCall:
    """Check a grouped call in torch's order (GroupedBlas.cpp), then the route of the profile's stack, then the
    row-wise kernel's operand dtypes; the :class:`GroupedCall` to compute, or the error torch or mmaemu raises.
    ``context``: the call's (the profile's default)."""
    profile = get_profile(profile, context=context)
    _check_layouts(mat_a, mat_b)
    if bias is not None:
        raise _rejects("Bias not supported yet: add the bias to the grouped result yourself")
    if scale_result is not None:
        raise _rejects("Scale result not supported yet")
    _check_offs(mat_a, mat_b, offs)
    if pair == "rowwise_rowwise":
        if scale_a.dtype != torch.float32 or scale_b.dtype != torch.float32:
            raise _rejects("For grouped FP8 rowwise, both scales must be float32 tensors")
        multiplier = offs.size(0) if mat_a.dim() == 2 and mat_b.dim() == 2 else 1
        _check_rowwise_scale(mat_a, scale_a, 0, 0, multiplier)
        _check_rowwise_scale(mat_b, scale_b, 1, 1, multiplier)
    if (out_dtype or torch.bfloat16) != torch.bfloat16:
        raise _rejects(f"Only bf16 high precision output types are supported for grouped gemm, got {out_dtype}")
    route = kernel_families.route("scaled_grouped_mm", pair, profile)
    if not route.computes:
        raise refusal_error("scaled_grouped_mm", pair, route, profile)
    for label, mat in (("mat_a", mat_a), ("mat_b", mat_b)):
        if mat.dtype != torch.float8_e4m3fn:
            raise _rejects(f"Expected {label} to be Float8_e4m3 matrix got {mat.dtype}: the row-wise grouped kernel "
                           f"takes float8_e4m3fn operands only")
    out, groups = _groups(mat_a, mat_b, scale_a, scale_b, offs, mat_a.device)
    return GroupedCall(pair, route, out, groups)


def _compute_group(group: Group, use_fast_accum: bool, profile, backend, context) -> None:
    """One group: the accumulators of the profile's preset (one CTA per output, S = 1), then the grouped
    epilogue through the row-wise recipe's (:func:`mmaemu.recipes.rowwise.rowwise_epilogue`: x scale first, no bias
    node, i.e. a -0 bias), in the call's ``context``."""
    from .api import accumulate
    from .recipes.rowwise import rowwise_epilogue

    m, n = group.out.shape
    if m == 0 or n == 0:
        return
    acc = accumulate(group.a, group.b.t(), use_fast_accum=use_fast_accum, profile=profile, splitk=1,
                     backend=backend, out_dtype_for_split=torch.bfloat16)
    no_bias = torch.full((n,), -0.0, dtype=torch.bfloat16)  # bits 0x8000: RN(-0 + q) = q for every q
    group.out.copy_(rowwise_epilogue(acc, group.sa, group.sb, no_bias, True, context))


def run_grouped(call: GroupedCall, use_fast_accum: bool, *, profile=None, backend="auto", context) -> torch.Tensor:
    """Compute a resolved grouped call group by group in the call's ``context`` (warning once that the model is
    experimental)."""
    report([Notice(ExperimentalPresetWarning, MATURITY_MESSAGE, ("grouped:cutlass-rowwise-sm90",))])
    profile = get_profile(profile, context=context)
    for group in call.groups:
        _compute_group(group, bool(use_fast_accum), profile, backend, context)
    return call.out


def _refuse_contraction_dim(contraction_dim) -> None:
    if tuple(contraction_dim or ()) not in ((), (-1, -2)):
        raise _rejects(f"Curently contraction dims must be (-1, -2) only, got {tuple(contraction_dim)}")


@untraced
def scaled_grouped_mm_op(self, mat2, scale_a, scale_b, offs=None, bias=None, scale_result=None, out_dtype=None,
                         use_fast_accum=False, *, profile=None, splitk="auto", backend="auto"):
    """``torch._scaled_grouped_mm`` (torch 2.13.0's schema) as the profile's reference GPU computes it."""
    with edge():
        context = for_call()
        _one_split(splitk)
        pair = _pair_of_v1(scale_a, scale_b)
        call = resolve_grouped(self, mat2, scale_a, scale_b, offs, bias, scale_result, out_dtype, pair,
                               profile=profile, context=context)
        return run_grouped(call, use_fast_accum, profile=profile, backend=backend, context=context)


@untraced
def scaled_grouped_mm_v2_op(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, offs=None,
                            bias=None, out_dtype=None, contraction_dim=(), use_fast_accum=False, *, profile=None,
                            splitk="auto", backend="auto"):
    """``torch._scaled_grouped_mm_v2`` (torch 2.13.0's schema: scale, recipe and swizzle lists; offs before bias)
    as the profile's reference GPU computes it."""
    with edge():
        context = for_call()
        _one_split(splitk)
        if not (self.dim() == 2 and mat2.dim() == 2):
            _refuse_contraction_dim(contraction_dim)
        scale_a, scale_b = _as_list(scale_a), _as_list(scale_b)
        pair = _pair_of_v2(_enum_values(_as_list(recipe_a)), _enum_values(_as_list(recipe_b)), self)
        if pair != "rowwise_rowwise":  # refused by the route; the scale lists are the block-scaled pairs' own
            resolved = get_profile(profile, context=context)
            route = kernel_families.route("scaled_grouped_mm", pair, resolved)
            raise refusal_error("scaled_grouped_mm", pair, route, resolved)
        call = resolve_grouped(self, mat2, scale_a[0], scale_b[0], offs, bias, None, out_dtype, pair,
                               profile=profile, context=context)
        return run_grouped(call, use_fast_accum, profile=profile, backend=backend, context=context)


def _one_split(splitk) -> None:
    from .platform.splitk import asks_one_split

    if not asks_one_split(splitk):
        raise UnsupportedFeatureError(f"splitk={splitk!r}: torch's grouped kernel never splits K (kGrouped, one CTA "
                                      f"per output over the group's K); use splitk='auto' or 1")


@untraced
def scaled_grouped_mm(mat_a, mat_b, scale_a, scale_recipe_a, scale_b, scale_recipe_b, swizzle_a=None,
                      swizzle_b=None, bias=None, offs=None, output_dtype: Optional[torch.dtype] = torch.bfloat16,
                      contraction_dim=(), use_fast_accum=False, *, profile=None, splitk="auto", backend="auto"):
    """``torch.nn.functional.scaled_grouped_mm`` (torch 2.13.0) as the profile's reference GPU computes it.

    Row-wise scales (``ScalingType.RowWise`` both) on an sm_90 profile are computed group by group (module
    documentation: the kernel, the layouts, the evidence; experimental, it warns); MXFP8 and FP4 grouped GEMMs
    (FBGEMM's kernels) and other platforms are refused with the way out. ``profile``, ``splitk`` (1 or "auto"
    only) and ``backend`` as in :func:`mmaemu.scaled_mm`.
    """
    return scaled_grouped_mm_v2_op(mat_a, mat_b, scale_a, scale_recipe_a, swizzle_a, scale_b, scale_recipe_b,
                                   swizzle_b, offs, bias, output_dtype, contraction_dim, use_fast_accum,
                                   profile=profile, splitk=splitk, backend=backend)

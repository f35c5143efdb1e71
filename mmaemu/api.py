"""The public entry points: ``scaled_mm``, ``accumulate`` and ``explain`` (platform.md section 6).

``scaled_mm`` takes torch 2.7.1's ``torch._scaled_mm`` arguments in the same order with the same defaults, plus
``out=``, ``profile=``, ``splitk=`` and ``backend=``, and returns the reference GPU's bits. With the B200 profile
(``b200-mx-experimental``) it also takes the MXFP8, MXFP4 and NVFP4 operands and swizzled block scales of torch's sm_100
``_scaled_mm`` (NVFP4: torch 2.8's rules; :mod:`mmaemu.plan.block_scaled`). The entry points are
excluded from ``torch.compile`` tracing (a graph break): a compiler must not trace into, or re-round, the
emulation.
"""

from __future__ import annotations

import torch

from .base._untraced import require_untraced, untraced
from .context import for_call
from .plan.cache import cached_plan_accumulate, cached_plan_scaled_mm
from .plan.planner import CallPlan, Plan, explain_scaled_mm
from .recipes.tensorwise import _accumulator, kept_cpu_call, run_cpu_gemm
from .warn import edge

__all__ = ["scaled_mm", "accumulate", "explain", "CallPlan"]


def _deliver(result: torch.Tensor, out):
    """Return the result, or write it into ``out`` (resized to [M, N] when its shape differs) and return out.

    The plan has checked that out can take the result (grad mode, storage); the writes run below autograd, as
    torch's own ``out=`` handling does, so an out that requires grad is filled under torch.no_grad().
    """
    if out is None:
        return result
    with torch.no_grad():
        if tuple(out.shape) != tuple(result.shape):
            _resize_contiguous(out, tuple(result.shape))
        out.copy_(result)
    return out


def _resize_contiguous(out: torch.Tensor, shape) -> None:
    """``out.resize_(shape)`` as torch's resize_output does it, also for an out that requires grad (whose resize_
    autograd refuses): grow the storage if needed, then point out at it with row-major strides."""
    rows, cols = shape
    storage = out.untyped_storage()
    needed = (out.storage_offset() + rows * cols) * out.element_size()
    if storage.nbytes() < needed:
        storage.resize_(needed)
    out.set_(storage, out.storage_offset(), shape, (cols, 1))


@untraced
def scaled_mm(input, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False,
              *, out=None, profile=None, splitk="auto", backend="auto"):
    """``torch._scaled_mm`` (torch 2.7.1) as the profile's reference GPU computes it, bit for bit.

    ``input`` [M, K] and ``mat2`` [K, N] (column-major, e.g. ``w.t()``) are float8 tensors; tensor-wise fp32
    scales; ``out_dtype`` defaults to input's dtype.

    MXFP8, MXFP4 and NVFP4 (profile ``"b200-mx-experimental"``, experimental): ``input`` [M, K] / ``mat2`` [K, N]
    float8 with ``float8_e8m0fnu`` scales (one per 32 elements of K), or ``float4_e2m1fn_x2`` [M, K/2] / [K/2, N]
    with ``float8_e8m0fnu`` (MXFP4) or ``float8_e4m3fn`` scales (NVFP4: UE4M3, one per 16); each scale tensor holds
    the operand's [rows, K / block] scales in the swizzled 32_4_4 layout (:func:`mmaemu.scale_layout.to_blocked`),
    ``128*ceil(rows/128) * 4*ceil(K/block/4)`` codes. NVFP4's two-level scaling: pass
    ``scale_a=(block_scales_a, global_a)`` and ``scale_b=(block_scales_b, global_b)`` with one-element fp32 global
    scales (torch's ``_scaled_mm_v2`` list form; alpha = fp32(global_a * global_b)). Outputs float32, bfloat16 or
    float16; ``splitk=1`` only; no bias; an FP4 K % 64 == 32 has its last instruction zero-padded.

    Block-wise FP8 (profile ``"hopper-cublaslt-blockwise-experimental"``, experimental): fp32 1x128 / 128x128 scales
    in torch ``_scaled_mm``'s layout (:mod:`mmaemu.plan.blockwise`), computed as cuBLASLt >= 12.9 does on an H100
    (:mod:`mmaemu.blockwise_cublaslt`); under the other profiles they are refused as torch 2.7.1 refuses them.

    ``profile``: a name from :func:`mmaemu.list_profiles`
    (default ``$MMAEMU_PROFILE`` or "hopper"). ``splitk``: "auto" (the reference's recorded decision), 1, or
    ``(S, scheme)``. ``backend``: "auto", "reference", "cpu", "cuda" or "cuda:<kernel>".
    Raises what torch 2.7.1 / cuBLASLt would (ReferenceRejectsError, TypeError), and UnsupportedFeatureError
    or SplitKUnknownError where mmaemu cannot reproduce the call exactly: it never approximates.
    """
    with edge():  # the warnings of the call are emitted here, at the caller's line
        return planned_scaled_mm(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, out,
                                 profile, splitk, backend, _process_weights())


def planned_scaled_mm(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, out, profile,
                      splitk, backend, weights):
    """The result of a scaled_mm call (inside an entry point's :class:`mmaemu.warn.edge`): its kept plan's compiled
    CPU call run on these tensors where the plan cache has one (:func:`mmaemu.plan.cache.cached_plan_scaled_mm`
    with ``compiled``: no plan is bound), else the plan run by :func:`run_scaled_mm_plan`. ``weights``: as
    there."""
    found = cached_plan_scaled_mm(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum,
                                  out=out, profile=profile, splitk=splitk, backend=backend, compiled=True)
    if type(found) is Plan:
        return run_scaled_mm_plan(found, weights)
    return _deliver(run_cpu_gemm(found, input, mat2, scale_a, scale_b, scale_result, out_dtype, weights), out)


def _process_weights():
    """The process-wide store of prepared B (:data:`mmaemu.cpu.prepared.WEIGHTS`), imported at the first call."""
    global _WEIGHTS
    if _WEIGHTS is None:
        from .cpu.prepared import WEIGHTS

        _WEIGHTS = WEIGHTS
    return _WEIGHTS


_WEIGHTS = None


def run_scaled_mm_plan(plan, weights=None):
    """Compute a planned scaled_mm call (:func:`mmaemu.plan.planner.plan_scaled_mm`) with its recipe
    (``plan.recipe.run``, :mod:`mmaemu.recipes`): the result, or ``out``.
    ``weights``: where the CPU engine keeps mat2's prepared panels between calls (:mod:`mmaemu.cpu.prepared`:
    the process-wide store, a layer's slot), or None (decoded for this call only)."""
    call = plan.call
    kept = kept_cpu_call(plan, weights)  # a kept tensor-wise plan on the cpu backend: one compiled call
    if kept is not None:
        return _deliver(kept, call.out)
    _require_data("scaled_mm", call, ("input", "mat2", "scale_a", "scale_b", "bias", "scale_result", "out"))
    if plan.action == "out-unchanged":
        return call.out
    if plan.action == "zeros":
        return _deliver(torch.zeros((call.M, call.N), dtype=call.out_dtype, device=call.device), call.out)
    return _deliver(plan.recipe.run(plan, weights), call.out)


def _require_data(caller: str, call, names) -> None:
    """Refuse to compute on the fake or functional tensors of a traced call (a TypeError with the way out)."""
    tensors = [(name, getattr(call, name)) for name in names]
    tensors += [(f"global_scale_{side}", g) for side, g in zip("ab", getattr(call, "global_scales", None) or ())]
    for name, tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            require_untraced(caller, name, tensor)


@untraced
def accumulate(a, b, *, use_fast_accum, profile=None, splitk="auto", backend="auto",
               out_dtype_for_split=torch.float32):
    """The fp32 accumulator [M, N] of ``a`` [M, K] times ``b`` [N, K]^T before any scaling (semantics.md f.8).

    No torch/cuBLAS/profile rejection applies: any K, layout and format pair (E5M2 x E5M2 included). The split
    decision is keyed as a standard-layout call with output dtype ``out_dtype_for_split``.
    """
    with edge():
        plan = cached_plan_accumulate(a, b, use_fast_accum=use_fast_accum, profile=profile, splitk=splitk,
                                      backend=backend, out_dtype_for_split=out_dtype_for_split)
        call = plan.call
        _require_data("accumulate", call, ("a", "b"))
        if plan.action == "zeros":
            return torch.zeros((call.M, call.N), dtype=torch.float32, device=call.device)
        return _accumulator(plan, call.a, call.b, call.fmt_a, call.fmt_b, call.use_fast_accum)[0]


@untraced
def explain(input, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False,
            *, out=None, profile=None, splitk="auto", backend="auto") -> CallPlan:
    """What ``scaled_mm`` would do with these arguments, as a :class:`CallPlan`; never raises for a bad call."""
    return explain_scaled_mm(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, out=out,
                             profile=profile, splitk=splitk, backend=backend, context=for_call())



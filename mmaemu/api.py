"""The public entry points: ``scaled_mm``, ``accumulate`` and ``explain`` (platform.md section 6).

``scaled_mm`` takes torch 2.7.1's ``torch._scaled_mm`` arguments in the same order with the same defaults, plus
``out=``, ``profile=``, ``splitk=`` and ``backend=``, and returns the reference GPU's bits. With the B200 profile
(``b200-mx-experimental``) it also takes the MXFP8, MXFP4 and NVFP4 operands and swizzled block scales of torch's sm_100
``_scaled_mm`` (NVFP4: torch 2.8's rules; :mod:`mmaemu.plan.block_scaled`). The entry points are
excluded from ``torch.compile`` tracing (a graph break): a compiler must not trace into, or re-round, the
emulation.
"""

from __future__ import annotations

import numpy
import torch

from ._untraced import require_untraced, untraced
from .context import for_call
from .formats import dtype_name
from .plan.cache import cached_plan_accumulate, cached_plan_scaled_mm
from .plan.planner import CallPlan, explain_scaled_mm
from .warn import edge, report

__all__ = ["scaled_mm", "accumulate", "explain", "CallPlan"]

_BITS_DTYPE = {"float32": torch.uint32, "bfloat16": torch.uint16, "float16": torch.uint16,
               "float8_e4m3fn": torch.uint8, "float8_e5m2": torch.uint8}


def _codes_rows(t: torch.Tensor) -> "numpy.ndarray":  # noqa: F821
    """uint8 codes of a 2-D float8 tensor, C-contiguous, on the CPU (no copy of a contiguous CPU tensor)."""
    if t.requires_grad:
        t = t.detach()
    if not t.is_cpu:
        t = t.cpu()
    return t.contiguous().view(torch.uint8).numpy()


def _accumulator(plan, a: torch.Tensor, b_rows: torch.Tensor, fmt_a: str, fmt_b: str, fast: bool, weights=None):
    """(fp32 accumulators [M, N] of a [M, K] times b_rows [N, K]^T on the tensors' device, the CUDA kernel that
    computed them or None for a CPU engine). ``weights``: where the fast CPU engine keeps B's prepared panels
    between calls (:mod:`mmaemu.cpu.prepared`), or None."""
    device = a.device
    split = plan.split
    if plan.backend.startswith("cuda"):
        from . import cuda as cuda_backend

        return cuda_backend.accumulate(plan.backend, a, b_rows, fmt_a, fmt_b, plan.preset, fast, split.S,
                                       split.scheme, context=plan.context)
    from .cpu import accumulate_codes

    b_codes = _codes_rows(b_rows)
    reference = plan.backend == "reference"
    engine = None if plan.cpu_engine is None else plan.cpu_engine.engine
    prepared = None
    if weights is not None and not reference and b_codes.size >= _PREPARED_MIN_CODES and device.type == "cpu":
        from .cpu.engine import OFFSET, TILE

        prepared = weights.prepared(OFFSET if engine == "offset" else TILE, fmt_b, b_rows, b_codes)
    acc = accumulate_codes(_codes_rows(a), b_codes, fmt_a, fmt_b, plan.preset, fast, split.S, split.scheme,
                           reference=reference, cpu_engine=engine, prepared_b=prepared)
    acc = torch.from_numpy(acc)
    return (acc if device.type == "cpu" else acc.to(device)), None


# A B of fewer codes is decoded at each call: its decode (about 2 ns a code) costs less than finding and checking
# its kept panels.
_PREPARED_MIN_CODES = 1 << 14


def _scale_bits(scale) -> int:
    """The fp32 bit pattern of a one-element fp32 scale, read as an integer (no float conversion)."""
    return scale.view(torch.int32).item() & 0xFFFFFFFF


def _plain_data(call) -> bool:
    """Whether every tensor of a tensor-wise call is a plain tensor with data (``torch.Tensor`` or
    ``torch.nn.Parameter``, neither functional nor functorch-wrapped): then :func:`_require_data` has nothing to
    refuse (:func:`mmaemu._untraced.traced_tensor_kind` finds a fake tensor only as such a subclass or wrapper)."""
    for t in (call.input, call.mat2, call.scale_a, call.scale_b, call.scale_result, call.out):
        if t is not None and (type(t) not in _PLAIN_TYPES or torch._is_functional_tensor(t)
                              or torch._C._functorch.is_functorch_wrapped_tensor(t)):
            return False
    return True


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _cpu_tensorwise(plan, weights) -> torch.Tensor:
    """The output of a kept tensor-wise plan on the cpu backend: the codes and the scales' bits to the one compiled
    call of :class:`mmaemu.cpu.fused.TensorwiseGemm` (``plan.cpu_gemm``, :mod:`mmaemu.plan.cache`), whose bits are
    those of :func:`_accumulator` then :func:`_epilogue`."""
    call, gemm = plan.call, plan.cpu_gemm
    b_rows = call.mat2.t()
    b_codes = _codes_rows(b_rows)
    if weights is not None and b_codes.size < _PREPARED_MIN_CODES:
        weights = None
    sr = call.scale_result
    scales = numpy.array((_scale_bits(call.scale_a), _scale_bits(call.scale_b), 0 if sr is None else _scale_bits(sr),
                          sr is not None), numpy.int64)
    bits = gemm.run(_codes_rows(call.input), b_codes, scales, weights, b_rows)
    return torch.from_numpy(bits).view(_BITS_DTYPE[gemm.out_name]).view(call.out_dtype)


def _epilogue(acc: torch.Tensor, computed_by, plan) -> torch.Tensor:
    """Output tensor of the epilogue (semantics.md (e)) of ``plan``'s call on the accumulator's device.

    An accumulator computed by a CUDA kernel (``computed_by``) gets the CUDA epilogue kernel (same arithmetic,
    validated on the device: its verdict read from the plan's context), so the result never leaves the device;
    otherwise (a CPU engine computed the accumulator, or that kernel is not validated there: warned) the CPU
    epilogue computes and the result is copied to the accumulator's device.
    """
    call = plan.call
    if computed_by is not None:
        from . import cuda as cuda_backend

        outcome = cuda_backend.epilogue(acc, call.scale_a, call.scale_b, call.scale_result, call.out_dtype,
                                        computed_by, context=plan.context)
        report(outcome.notices)
        if outcome.result is not None:
            return outcome.result
    from .cpu import epilogue_codes

    out_name = dtype_name(call.out_dtype)
    scale_result = _scale_bits(call.scale_result) if call.scale_result is not None else None
    acc_values = acc.numpy() if acc.device.type == "cpu" else acc.cpu().numpy()
    bits = epilogue_codes(acc_values, _scale_bits(call.scale_a), _scale_bits(call.scale_b), scale_result, out_name)
    result = torch.from_numpy(bits).view(_BITS_DTYPE[out_name]).view(call.out_dtype)
    return result if acc.device.type == "cpu" else result.to(acc.device)


_ONE_F32_BITS = 0x3F800000


def _block_scaled_codes(t: torch.Tensor, fmt: str):
    """One uint8 code per element [rows, K] of a row-major float8 or packed float4_e2m1fn_x2 operand."""
    from . import formats

    codes = _codes_rows(t)
    return formats.unpack_fp4(codes) if fmt == "e2m1" else codes


def _block_scaled_accumulator(plan) -> torch.Tensor:
    """fp32 accumulators [M, N] of an MXFP8 / MXFP4 / NVFP4 call: the kernel's operands (the swizzled scales mapped
    back to their blocks, K zero-padded to whole instructions: :func:`mmaemu.plan.block_scaled.kernel_operands`),
    then one chain of the instruction per output."""
    from .plan.block_scaled import kernel_operands

    call = plan.call
    spec = call.block_scaled
    a, b, sa, sb = kernel_operands(_block_scaled_codes(call.input, spec.fmt_a),
                                   _block_scaled_codes(call.mat2.t(), spec.fmt_b),
                                   _codes_rows(call.scale_a.reshape(-1)), _codes_rows(call.scale_b.reshape(-1)), spec)
    if plan.backend == "cuda:simple":
        from .cuda.block_scaled.kernel import accumulate_block_scaled_cuda

        return accumulate_block_scaled_cuda(a, b, spec.fmt_a, spec.fmt_b, sa, sb, spec.recipe.scale_fmt, spec.preset,
                                            call.device)
    from .cpu.block_scaled import accumulate_block_scaled

    acc = accumulate_block_scaled(a, b, spec.fmt_a, spec.fmt_b, sa, sb, spec.recipe.scale_fmt, spec.preset,
                                  reference=plan.backend == "reference")
    return torch.from_numpy(acc)


def _block_scaled_epilogue(acc: torch.Tensor, call) -> torch.Tensor:
    """cuBLASLt's epilogue of a block-scaled call (:mod:`mmaemu.platform.block_scaled`): alpha = 1, or
    fp32(global_scale_a * global_scale_b) for two-level NVFP4, applied as semantics.md (e) applies scale_a *
    scale_b; on the CPU, the result copied to the call's device."""
    from .cpu import epilogue_codes

    out_name = dtype_name(call.out_dtype)
    if call.global_scales is None:
        alpha_bits = (_ONE_F32_BITS, _ONE_F32_BITS)
    else:
        alpha_bits = tuple(_scale_bits(g) for g in call.global_scales)
    bits = epilogue_codes(acc.cpu().numpy(), *alpha_bits, None, out_name)
    return torch.from_numpy(bits).view(_BITS_DTYPE[out_name]).view(call.out_dtype).to(call.device)


def _bits(t: torch.Tensor, view) -> "numpy.ndarray":  # noqa: F821
    return t.detach().contiguous().reshape(-1).view(view).cpu().numpy()


def _rowwise_epilogue(acc: torch.Tensor, call) -> torch.Tensor:
    """bf16 output of torch's row-wise epilogue (:mod:`mmaemu.arith.rowwise`) on the accumulator's device: the
    CUDA kernel of that arithmetic where the accumulator is on a CUDA device, else the CPU loops."""
    from .platform.rowwise import scale_order

    x_first = scale_order(call.M, call.N).x_first
    if acc.device.type == "cuda":
        from . import cuda as cuda_backend

        return cuda_backend.rowwise_epilogue(acc, call.scale_a, call.scale_b, call.bias, x_first)
    from .cpu import rowwise_epilogue_codes

    bias = None if call.bias is None else _bits(call.bias, torch.uint16)
    bits = rowwise_epilogue_codes(acc.numpy(), _bits(call.scale_a, torch.uint32), _bits(call.scale_b, torch.uint32),
                                  bias, x_first)
    return torch.from_numpy(bits).view(torch.bfloat16)


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
        plan = cached_plan_scaled_mm(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum,
                                     out=out, profile=profile, splitk=splitk, backend=backend)
        return run_scaled_mm_plan(plan, weights=_process_weights())


def _process_weights():
    """The process-wide store of prepared B (:data:`mmaemu.cpu.prepared.WEIGHTS`)."""
    from .cpu.prepared import WEIGHTS

    return WEIGHTS


def run_scaled_mm_plan(plan, weights=None):
    """Compute a planned scaled_mm call (:func:`mmaemu.plan.planner.plan_scaled_mm`): the result, or ``out``.
    ``weights``: where the CPU engine keeps mat2's prepared panels between calls (:mod:`mmaemu.cpu.prepared`:
    the process-wide store, a layer's slot), or None (decoded for this call only)."""
    call = plan.call
    if getattr(plan, "cpu_gemm", None) is not None and _plain_data(call):  # kept tensor-wise plan, cpu backend
        return _deliver(_cpu_tensorwise(plan, weights), call.out)
    _require_data("scaled_mm", call, ("input", "mat2", "scale_a", "scale_b", "bias", "scale_result", "out"))
    if plan.action == "out-unchanged":
        return call.out
    if plan.action == "zeros":
        return _deliver(torch.zeros((call.M, call.N), dtype=call.out_dtype, device=call.device), call.out)
    if call.block_scaled is not None:
        return _deliver(_block_scaled_epilogue(_block_scaled_accumulator(plan), call), call.out)
    if call.blockwise is not None:
        from .blockwise_cublaslt import compute_blockwise

        spec = call.blockwise
        return _deliver(compute_blockwise(call.input, call.mat2, call.scale_a, call.scale_b, spec, call.bias,
                                          call.out_dtype, plan.backend), call.out)
    acc, computed_by = _accumulator(plan, call.input, call.mat2.t(), call.fmt_a, call.fmt_b, call.use_fast_accum,
                                    weights)
    if call.rowwise:
        return _deliver(_rowwise_epilogue(acc, call), call.out)
    return _deliver(_epilogue(acc, computed_by, plan), call.out)


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



"""The rules of ``scaled_mm``'s validation, one function each (semantics.md section (f); platform.md sections 1, 2, 9),
and the validated call they describe (:class:`ScaledMMCall`).

:func:`mmaemu.plan.validate.validate_scaled_mm` applies them in torch's order: the common rules (f.1, f.2, the
checks of ``out=`` torch makes before its zero-size return, f.3) here, then the rules of the call's recipe (each
recipe module of :mod:`mmaemu.recipes`: the tensor-wise f.4-f.6 are the ones at the end of this module). The message
convention is validate.py's.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

from .. import formats
from ..errors import ReferenceRejectsError, UnsupportedFeatureError
from ..base.tensor_kinds import require_dense
from .descriptors import TensorDescriptor, TorchName, dtype_name
from .layout import byte_misalignment, is_column_major, is_neither_major, is_row_major, leading_dimensions, \
    mat2_is_column_major
from .block_scaled import FP4_DTYPE_NAME

if TYPE_CHECKING:
    import torch

# Dtypes are compared by name (:func:`~mmaemu.plan.descriptors.dtype_name`), so that a call described by
# :class:`~mmaemu.plan.descriptors.TensorDescriptor` operands is validated without importing torch.

#: The two FP8 formats mmaemu models, by torch dtype name.
FP8_FORMAT_OF_DTYPE_NAME = {name: fmt for fmt, name in formats.TORCH_NAMES.items()}

#: torch's ``isFloat8Type`` in 2.7.1 (f.2.11).
_TORCH_FLOAT8_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")

#: FP8 dtypes torch 2.7.1 accepts in f.2 but that fail on CUDA (f.4.3).
_UNSUPPORTED_FLOAT8_DTYPES = ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")

#: Output dtypes cuBLASLt 12.8.3 has an FP8 GEMM for (f.4.4).
_CUBLAS_OUT_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


def _fp8_format(dtype) -> Optional[str]:
    """"e4m3" / "e5m2" of a modelled FP8 dtype, None for any other dtype."""
    return FP8_FORMAT_OF_DTYPE_NAME.get(dtype_name(dtype))


def _is_tensor(value) -> bool:
    """A torch.Tensor or a TensorDescriptor (torch is imported only for a value that is not a descriptor)."""
    if isinstance(value, TensorDescriptor):
        return True
    import torch

    return isinstance(value, torch.Tensor)


def _is_dtype(value) -> bool:
    """A torch.dtype or the TorchName of one (torch is imported only for a value that is not a TorchName)."""
    if isinstance(value, TorchName):
        return True
    import torch

    return isinstance(value, torch.dtype)


def _grad_enabled() -> bool:
    import torch

    return torch.is_grad_enabled()

_TORCH = "[torch 2.7.1 _scaled_mm]"
_CUBLASLT = "[cuBLASLt 12.8.3.14]"
_SCOPE = "[mmaemu scope]"


# ----------------------------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class ScaledMMCall:
    """A ``scaled_mm`` call that passed validation, with what the planner and the backends need.

    * ``input``, ``mat2``: the operands after torch's silent copy of a neither-row-nor-column-major input
      (``input_copied`` says whether it happened).
    * ``M``, ``N``, ``K``: input [M, K] x mat2 [K, N].
    * ``fmt_a``, ``fmt_b``: "e4m3" / "e5m2" of input / mat2; None only in a zero-size call whose operand dtype
      mmaemu does not model (fnuz, e8m0).
    * ``out_dtype``: the effective output dtype od (out_dtype, else out.dtype, else input.dtype).
    * ``zero_size``: M, N or K is 0 (f.3): the result is empty or, for K = 0, +0 everywhere; nothing else applies.
    * ``layout_std``: input contiguous and mat2.t() contiguous (platform.md section 2), after the copy.
    * ``out_column_major``: out of shape [M, N] is column-major: kept, and the split-K key is swapped.
    * ``out_unusable``: out of shape [M, N] is neither row- nor column-major: torch computes into a private copy,
      so out is returned unchanged (with a UserWarning).
    * ``out_resize``: out has another shape and is resized to [M, N] (a row-major tensor);
      ``out_resize_warns``: it had elements, so the resize warns.
    * ``device``: input's device.

    The three out flags are False in a zero-size call except ``out_resize``/``out_resize_warns`` (torch resizes
    out before its early return and zero-fills out itself).

    * ``recipe``: the recipe (:mod:`mmaemu.recipes`) whose rules the call passed, which plans and computes it; None
      for a zero-size call (torch returns before choosing a kernel, so no recipe applies).
    * ``spec``: the recipe's own call spec where it has one, made by its validation and read by its plan and run
      (a new recipe needs no new field here): a block-wise call's :class:`mmaemu.plan.blockwise.BlockwiseSpec`
      (the scale blocks and formats), an MXFP8 / NVFP4 call's :class:`mmaemu.plan.block_scaled.BlockScaledSpec`
      (the recipe, its preset, the element formats and K in elements; fmt_a/fmt_b are then None); None for
      tensor-wise and row-wise calls.
    * ``bias``: the validated bias (bf16 [N]) or None, of the recipes that keep it (row-wise: the out flags other
      than the resize are then False, the kernel refuses an out that is not row-major; block-wise).
    * ``global_scales``: NVFP4's (global_scale_a, global_scale_b) or None.
    """

    input: torch.Tensor = dataclasses.field(repr=False)
    mat2: torch.Tensor = dataclasses.field(repr=False)
    M: int
    N: int
    K: int
    fmt_a: Optional[str]
    fmt_b: Optional[str]
    out_dtype: torch.dtype
    scale_a: torch.Tensor = dataclasses.field(repr=False)
    scale_b: torch.Tensor = dataclasses.field(repr=False)
    scale_result: Optional[torch.Tensor] = dataclasses.field(repr=False)
    use_fast_accum: bool
    out: Optional[torch.Tensor] = dataclasses.field(repr=False)
    zero_size: bool
    layout_std: bool
    out_column_major: bool
    out_unusable: bool
    out_resize: bool
    out_resize_warns: bool
    input_copied: bool
    device: torch.device
    bias: Optional[torch.Tensor] = dataclasses.field(default=None, repr=False)
    spec: Optional[object] = None
    global_scales: Optional[tuple] = dataclasses.field(default=None, repr=False)
    recipe: Optional[object] = dataclasses.field(default=None, repr=False)


def split_key(call: ScaledMMCall) -> tuple[int, int, int, Optional[str], Optional[str]]:
    """(M, N, K, fmt_a, fmt_b) as the cuBLASLt heuristic sees the call (platform.md section 2).

    A column-major out of shape [M, N] makes torch run the problem un-transposed: cuBLASLt then sees a row-major
    call of shape (N, M, K) with the formats swapped, so the key is (N, M, K, fmt_b, fmt_a).
    """
    if call.out_column_major:
        return (call.N, call.M, call.K, call.fmt_b, call.fmt_a)
    return (call.M, call.N, call.K, call.fmt_a, call.fmt_b)


# --- f.1 Python types -> TypeError -------------------------------------------------------------------------------


def _named_tensors(input, mat2, scale_a, scale_b, bias, scale_result, out):
    """(name, tensor) of every tensor argument given."""
    named = (("input", input), ("mat2", mat2), ("scale_a", scale_a), ("scale_b", scale_b), ("bias", bias),
             ("scale_result", scale_result), ("out", out))
    return [(name, value) for name, value in named if value is not None]


def _check_python_types(input, mat2, scale_a, scale_b, bias, scale_result, out, out_dtype, use_fast_accum):
    """f.1: tensors where tensors are required, a torch.dtype or None, and an exact Python bool."""
    # f.1.1
    for name, value in (("input", input), ("mat2", mat2), ("scale_a", scale_a), ("scale_b", scale_b)):
        if not _is_tensor(value):
            raise TypeError(f"scaled_mm: {name} must be a torch.Tensor, got {type(value).__name__}")
    # f.1.2
    for name, value in (("bias", bias), ("scale_result", scale_result), ("out", out)):
        if value is not None and not _is_tensor(value):
            raise TypeError(f"scaled_mm: {name} must be None or a torch.Tensor, got {type(value).__name__}")
    # mmaemu's addition to f.1: a sparse or nested tensor has no dense layout of codes
    for name, value in _named_tensors(input, mat2, scale_a, scale_b, bias, scale_result, out):
        require_dense("scaled_mm", name, value)
    # f.1.3
    if out_dtype is not None and not _is_dtype(out_dtype):
        raise TypeError(
            f"scaled_mm: out_dtype must be None or a torch.dtype such as torch.bfloat16, got {out_dtype!r}"
        )
    # f.1.4: torch's argument parser takes only a real bool (numpy.bool_ included in the refusal)
    if type(use_fast_accum) is not bool:
        raise TypeError(
            f"scaled_mm: use_fast_accum must be a Python bool, got {type(use_fast_accum).__name__} (torch 2.7.1's "
            f"argument parser refuses it); pass bool(use_fast_accum)"
        )


# --- f.2 torch _scaled_mm checks -> ReferenceRejectsError --------------------------------------------------------


def _torch_rejects(message: str) -> ReferenceRejectsError:
    return ReferenceRejectsError(f"{message} {_TORCH}")


def _check_matrices(input: torch.Tensor, mat2: torch.Tensor) -> None:
    """f.2.1-3: both operands 2-D, inner dimensions equal."""
    if input.dim() != 2:  # f.2.1
        raise _torch_rejects(
            f"mat1 must be a matrix: input has {input.dim()} dimensions (shape {list(input.shape)}); pass a 2-D "
            f"[M, K] tensor, e.g. input.reshape(-1, input.shape[-1])"
        )
    if mat2.dim() != 2:  # f.2.2
        raise _torch_rejects(
            f"mat2 must be a matrix: mat2 has {mat2.dim()} dimensions (shape {list(mat2.shape)}); pass a 2-D [K, N] "
            f"tensor"
        )
    if input.shape[1] != mat2.shape[0]:  # f.2.3
        raise _torch_rejects(
            f"mat1 and mat2 shapes cannot be multiplied ({input.shape[0]}x{input.shape[1]} and "
            f"{mat2.shape[0]}x{mat2.shape[1]}); mat2 must be [K, N] for an [M, K] input"
        )


def _is_rowwise_scaling(scale_a: torch.Tensor, scale_b: torch.Tensor, M: int, N: int, hint: str = "") -> bool:
    """f.2.4-5 (torch's get_scaling_type): fp32 scales; tensor-wise (one element each) or row-wise (2-D, shapes
    (M, 1) and (1, N), both contiguous). Returns True for row-wise. ``hint``: appended to the refusal of other
    scales (the profile that computes torch 2.13's block-wise scales, :func:`.blockwise.blockwise_hint`)."""
    if dtype_name(scale_a.dtype) != "float32" or dtype_name(scale_b.dtype) != "float32":  # f.2.4
        raise _torch_rejects(
            f"Both scale_a and scale_b must be float (fp32) tensors: got scale_a {scale_a.dtype} and scale_b "
            f"{scale_b.dtype}; pass scale.float()"
        )
    # f.2.5
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return False
    if scale_a.dim() != 2 or scale_b.dim() != 2:
        raise _torch_rejects(
            f"For non-TensorWise scaling, scale tensors must be 2-dimensional, but got scale_a.dim()={scale_a.dim()} "
            f"and scale_b.dim()={scale_b.dim()}; pass one-element scales for tensor-wise scaling"
        )
    if tuple(scale_a.shape) == (M, 1) and tuple(scale_b.shape) == (1, N):
        if not (scale_a.is_contiguous() and scale_b.is_contiguous()):
            raise _torch_rejects(
                "Both scale_a and scale_b must be contiguous for RowWise scaling; pass scale.contiguous()"
            )
        return True
    raise _torch_rejects(
        f"Invalid scaling configuration. For TensorWise scaling, both scales should be scalar. For RowWise "
        f"scaling, scale_a should be ({M}, 1) and scale_b should be (1, {N}), got "
        f"scale_a.size()=({scale_a.shape[0]}, {scale_a.shape[1]}) and "
        f"scale_b.size()=({scale_b.shape[0]}, {scale_b.shape[1]}){hint}"
    )


def _check_scale_result(scale_result: Optional[torch.Tensor]) -> None:
    """f.2.6: scale_result, when given, is a one-element float32 tensor."""
    if scale_result is not None and (scale_result.numel() != 1 or dtype_name(scale_result.dtype) != "float32"):
        raise _torch_rejects(
            f"scale_result must be a float scalar: got {scale_result.numel()} element(s) of {scale_result.dtype}; "
            f"pass a one-element float32 tensor"
        )


def _check_bias_size(bias: Optional[torch.Tensor], N: int) -> None:
    """f.2.7: bias, when given, has N elements."""
    if bias is not None and bias.numel() != N:
        raise _torch_rejects(f"Bias must be size {N} but got {bias.numel()}")


def _check_divisible_by_16(M: int, K: int, N: int) -> None:
    """f.2.8-9: K (mat1's trailing dimension) and both dimensions of mat2 divisible by 16; M is free."""
    if K % 16 != 0:  # f.2.8
        raise _torch_rejects(
            f"Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: ({M}x{K}); zero-pad K "
            f"to a multiple of 16 (mmaemu.accumulate takes any K)"
        )
    if K % 16 != 0 or N % 16 != 0:  # f.2.9
        raise _torch_rejects(
            f"mat2 shape ({K}x{N}) must be divisible by 16; zero-pad N to a multiple of 16 and drop the extra "
            f"columns of the result"
        )


def _effective_out_dtype(input: torch.Tensor, out: Optional[torch.Tensor], out_dtype) -> torch.dtype:
    """f.2.10: out and out_dtype must agree; od = out_dtype, else out.dtype, else input.dtype."""
    if out is not None and out_dtype is not None and out_dtype != out.dtype:
        raise _torch_rejects(
            f"out_dtype must match output matrix type: out_dtype={out_dtype} but out.dtype={out.dtype}; drop "
            f"out_dtype or pass an out of that dtype"
        )
    if out_dtype is not None:
        return out_dtype
    if out is not None:
        return out.dtype
    return input.dtype


def _check_float8_operands(input: torch.Tensor, mat2: torch.Tensor, fp4: bool = False) -> None:
    """f.2.11-12: both operands of a torch float8 dtype (or, with block scales, float4_e2m1fn_x2: torch 2.8's
    rule), and not both float8_e5m2."""
    for name, tensor in (("mat1", input), ("mat2", mat2)):  # f.2.11
        if fp4 and dtype_name(tensor.dtype) == FP4_DTYPE_NAME:
            continue
        if fp4 and dtype_name(tensor.dtype) not in _TORCH_FLOAT8_DTYPES:
            raise _torch_rejects(f"Expected {name} to be Float8 or Float4_x2 matrix got {tensor.dtype}")
        if dtype_name(tensor.dtype) not in _TORCH_FLOAT8_DTYPES:
            raise _torch_rejects(
                f"Expected {name} to be Float8 matrix got {tensor.dtype}; quantize it to torch.float8_e4m3fn or "
                f"torch.float8_e5m2"
            )
    if dtype_name(input.dtype) == dtype_name(mat2.dtype) == "float8_e5m2":  # f.2.12
        raise _torch_rejects(
            "Multiplication of two Float8_e5m2 matrices is not supported; make one operand float8_e4m3fn "
            "(mmaemu.accumulate computes E5M2 x E5M2)"
        )


def _check_fp4_fast_accum(input: torch.Tensor, mat2: torch.Tensor, use_fast_accum: bool) -> None:
    """torch 2.8 (block scales): use_fast_accum is refused with FP4 operands."""
    if use_fast_accum and FP4_DTYPE_NAME in (dtype_name(input.dtype), dtype_name(mat2.dtype)):
        raise _torch_rejects("`use_fast_accum` is not supported when `mat1` or `mat2` tensors have the "
                             "`Float4_e2m1fn_x2` dtype; pass use_fast_accum=False")


def _check_bias_dtype(bias: Optional[torch.Tensor], od: torch.dtype) -> None:
    """f.2.13: no bias with fp32 output; bias bf16 or fp16, matching a bf16 / fp16 output."""
    if bias is None:
        return
    od_name, bias_name = dtype_name(od), dtype_name(bias.dtype)
    if od_name == "float32":
        raise _torch_rejects("Bias is not supported when out_dtype is set to Float32")
    if bias_name not in ("bfloat16", "float16"):
        raise _torch_rejects(f"Bias must be either Half or BFloat16, but got {bias.dtype}")
    if od_name == "bfloat16" and bias_name != "bfloat16":
        raise _torch_rejects(f"Bias must be BFloat16 to compute {od} output, but got {bias.dtype}")
    if od_name == "float16" and bias_name != "float16":
        raise _torch_rejects(f"Bias must be Float16 to compute {od} output, but got {bias.dtype}")


def _check_same_device(input, mat2, scale_a, scale_b, bias, scale_result, out) -> None:
    """f.2.14: out, mat2, bias, scale_a, scale_b and scale_result on input's device."""
    others = (("out", out), ("mat2", mat2), ("bias", bias), ("scale_a", scale_a), ("scale_b", scale_b),
              ("scale_result", scale_result))
    for name, tensor in others:
        if tensor is not None and tensor.device != input.device:
            raise _torch_rejects(
                f"Expected all tensors to be on the same device: {name} is on {tensor.device} but mat1 (input) is "
                f"on {input.device}; move it with .to(input.device)"
            )


def _check_out_receives(out: Optional[torch.Tensor], M: int, N: int) -> None:
    """What torch 2.7.1 checks of ``out=`` before its zero-size early return, so before any computing here.

    * Autograd: under grad mode an out that requires grad is refused ("functions with out=... arguments don't
      support automatic differentiation"); under torch.no_grad() it is filled.
    * resize_output: an out of another shape than [M, N] is resized; a storage too small for the [M, N] result
      that cannot grow (memory lent by numpy, a non-resizable storage) fails ("Trying to resize storage that is
      not resizable").
    """
    if out is None:
        return
    if out.requires_grad and _grad_enabled():
        raise _torch_rejects(
            "_scaled_mm(): functions with out=... arguments don't support automatic differentiation, but one of "
            "the arguments requires grad: out requires grad; wrap the call in torch.no_grad() or pass "
            "out=out.detach()"
        )
    if tuple(out.shape) == (M, N):
        return
    needed = (out.storage_offset() + M * N) * out.element_size()
    storage = out.untyped_storage()
    if storage.nbytes() < needed and not storage.resizable():
        raise _torch_rejects(
            f"Trying to resize storage that is not resizable: out= has shape {list(out.shape)}, the result is "
            f"[{M}, {N}] ({needed} bytes from out's storage offset) and out's storage ({storage.nbytes()} bytes, "
            f"e.g. memory lent by numpy) cannot grow; pass an out of shape [{M}, {N}] or out=None"
        )


# --- f.4 cuBLAS / cuBLASLt-level checks -> ReferenceRejectsError -------------------------------------------------


def _cublaslt_rejects(message: str) -> ReferenceRejectsError:
    return ReferenceRejectsError(f"{message} {_CUBLASLT}")


def _check_layout(input: torch.Tensor, mat2: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """f.4.2: input row-major [M, K], mat2 column-major [K, N]; a neither-major input is copied (torch does).

    Returns (input, copied). A neither-major mat2 would be copied to a row-major tensor, which is refused, so it
    is refused here directly.
    """
    if is_column_major(input):
        raise _cublaslt_rejects(
            f"Only multiplication of row-major and column-major matrices is supported by cuBLASLt: input (mat1) "
            f"must be row-major [M, K] but is column-major (strides {tuple(input.stride())}); pass "
            f"input.contiguous()"
        )
    copied = is_neither_major(input)
    if copied:
        input = input.contiguous()
    if not mat2_is_column_major(mat2):
        raise _cublaslt_rejects(
            f"Only multiplication of row-major and column-major matrices is supported by cuBLASLt: mat2 must be "
            f"column-major [K, N] (mat2.t() row-major), got strides {tuple(mat2.stride())}; pass w.t() for a "
            f"row-major [N, K] weight w, e.g. mat2.t().contiguous().t()"
        )
    return input, copied


def _check_modelled_float8(input: torch.Tensor, mat2: torch.Tensor) -> None:
    """f.4.3: fnuz and e8m0 operands pass torch's checks but fail on CUDA in torch 2.7.1."""
    for name, tensor in (("input", input), ("mat2", mat2)):
        if dtype_name(tensor.dtype) in _UNSUPPORTED_FLOAT8_DTYPES:
            raise _cublaslt_rejects(
                f"{name} dtype {tensor.dtype} is not supported by the FP8 GEMM on sm_89 / sm_90 (torch 2.7.1 fails "
                f"on CUDA for fnuz and e8m0 operands); use torch.float8_e4m3fn or torch.float8_e5m2"
            )


def _check_cublas_out_dtype(od: torch.dtype) -> None:
    """f.4.4: cuBLASLt has FP8 GEMMs only for fp32, bf16, fp16, e4m3fn and e5m2 outputs."""
    if dtype_name(od) not in _CUBLAS_OUT_DTYPES:
        raise _cublaslt_rejects(
            f"CUBLAS_STATUS_NOT_SUPPORTED: no FP8 GEMM with output dtype {od}; use torch.float32, torch.bfloat16, "
            f"torch.float16, torch.float8_e4m3fn or torch.float8_e5m2"
        )


def _check_alignment(input: torch.Tensor, mat2: torch.Tensor) -> None:
    """f.4.5: both operands start on a 16-byte boundary (CPU: storage_offset * element_size)."""
    for name, tensor in (("input", input), ("mat2", mat2)):
        misalignment = byte_misalignment(tensor)
        if misalignment:
            raise _cublaslt_rejects(
                f"FP8 operands must be 16-byte aligned: {name}'s data starts {misalignment} byte(s) past a 16-byte "
                f"boundary (storage_offset {tensor.storage_offset()}); pass {name}.clone() or slice at a multiple "
                f"of 16 bytes"
            )


def _check_leading_dimensions(input: torch.Tensor, mat2: torch.Tensor) -> None:
    """f.4.6: lda and ldb multiples of 16 (lda = K when M == 1, ldb = K when N == 1)."""
    lda, ldb = leading_dimensions(input, mat2)
    if lda % 16 != 0 or ldb % 16 != 0:
        raise _cublaslt_rejects(
            f"FP8 leading dimensions must be multiples of 16: lda={lda} (input.stride(0)), ldb={ldb} "
            f"(mat2.stride(1)); pad the leading dimension to a multiple of 16 elements, or pass input.contiguous() "
            f"and mat2.t().contiguous().t()"
        )


# --- f.5 profile rejections -> ReferenceRejectsError -------------------------------------------------------------


def _check_profile(profile, fmt_a: str, fmt_b: str, od: torch.dtype) -> None:
    """f.5: the first RejectRule of the profile matching (fmt_a, fmt_b, od) refuses the call."""
    rule = profile.rejection(fmt_a, fmt_b, dtype_name(od))  # the form RejectRule.out_dtype uses
    if rule is not None:
        raise ReferenceRejectsError(f"{rule.message} [profile {profile.name}]")


# --- f.6 scope -> UnsupportedFeatureError ------------------------------------------------------------------------


def _check_scope(bias, **grad_candidates) -> None:
    """f.6 of a tensor-wise call, in order: bias; requires_grad under grad mode. Valid on the reference platform,
    never approximated. (Row-wise calls have their own rules: :mod:`.rowwise`.)"""
    if bias is not None:
        raise UnsupportedFeatureError(
            f"bias is valid on the reference platform but not modelled by mmaemu (the fused bias epilogue is "
            f"never approximated); call scaled_mm without bias {_SCOPE}"
        )
    _check_no_grad(grad_candidates)


def _check_no_grad(tensors: dict) -> None:
    """f.6 / f.8: inference only; requires_grad=True is refused while grad mode is enabled."""
    needing_grad = [name for name, tensor in tensors.items() if tensor is not None and tensor.requires_grad]
    if needing_grad and _grad_enabled():
        raise UnsupportedFeatureError(
            f"{', '.join(needing_grad)} require(s) grad while grad mode is enabled: mmaemu is inference only (no "
            f"autograd); wrap the call in torch.no_grad() or pass .detach()ed tensors {_SCOPE}"
        )


# --- out= handling (f.7.2 flags; no warning here) ----------------------------------------------------------------


def _out_resize(out: Optional[torch.Tensor], M: int, N: int) -> tuple[bool, bool]:
    """(resize, warns): an out of another shape than [M, N] is resized; the resize warns unless out was empty."""
    if out is None or tuple(out.shape) == (M, N):
        return False, False
    return True, out.numel() > 0


def _out_flags(out: Optional[torch.Tensor], M: int, N: int) -> dict:
    """f.7.2 / platform.md section 2: column-major out (kept, key swapped), neither-major out (unusable:
    returned unchanged), other shape (resized to a row-major [M, N])."""
    resize, resize_warns = _out_resize(out, M, N)
    same_shape = out is not None and not resize
    return dict(
        out_column_major=same_shape and is_column_major(out),
        out_unusable=same_shape and not is_row_major(out) and not is_column_major(out),
        out_resize=resize,
        out_resize_warns=resize_warns,
    )

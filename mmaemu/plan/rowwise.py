"""Validation of a row-wise ``scaled_mm`` call after torch's common checks (semantics.md f.1-f.3), as torch 2.7.1
does it: ``_scaled_mm_out_cuda`` sends a row-wise call to its CUTLASS kernel ``f8f8bf16_rowwise`` before any
cuBLASLt argument handling, so none of f.4.2-f.4.6 or f.5 applies; the kernel's ``check_inputs`` does instead.

:func:`check_rowwise_call` raises, in this order (the first failing rule):

* R.1 output dtype not bfloat16 -> ``ReferenceRejectsError`` (Blas.cpp, before the kernel is called);
* R.2 the kernel's ``check_inputs``, in its order -> ``ReferenceRejectsError``: mat1 dtype float8_e4m3fn or
  float8_e5m2; mat2 dtype float8_e4m3fn; mat1 row-major (stride(1) == 1, stride(0) >= K); mat2 column-major
  (stride(0) == 1, stride(1) >= K); scale_a.stride(0) == 1; scale_b.stride(1) == 1; bias 1-D with stride 1; out
  row-major (stride(1) == 1, stride(0) >= N) -- a column-major or neither-major out is refused, not computed;
* R.3 the platform: only torch's sm_90 kernel is modelled -> ``UnsupportedFeatureError`` (the sm_89 kernel is a
  different, stream-K CUTLASS 2.x GEMM; see :func:`mmaemu.platform.rowwise.platform_refusal`);
* R.4 what the source leaves undefined -> ``UnsupportedFeatureError``: the kernel's TMA descriptors need 16-byte
  aligned operand and output addresses and leading dimensions (lda, ldb multiples of 16 elements, ldc of 8);
  CUTLASS's ``can_implement`` does not check them and a failed descriptor is not an error there, so what the GPU
  returns is not fixed by the source.

Tags: ``[torch 2.7.1 _scaled_mm]`` for Blas.cpp, ``[torch 2.7.1 f8f8bf16_rowwise]`` for the kernel's checks,
``[mmaemu scope]`` for R.3 and R.4.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..errors import ReferenceRejectsError, UnsupportedFeatureError
from ..platform.rowwise import platform_refusal
from .descriptors import dtype_name
from .layout import byte_misalignment

if TYPE_CHECKING:
    import torch

__all__ = ["check_rowwise_call"]

_BLAS = "[torch 2.7.1 _scaled_mm]"
_KERNEL = "[torch 2.7.1 f8f8bf16_rowwise]"
_SCOPE = "[mmaemu scope]"


def _kernel_rejects(condition: str, why: str) -> ReferenceRejectsError:
    return ReferenceRejectsError(f"Expected {condition} to be true, but got false: {why} {_KERNEL}")


def check_rowwise_call(input: torch.Tensor, mat2: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                       bias: Optional[torch.Tensor], out: Optional[torch.Tensor], od: torch.dtype, profile) -> None:
    """R.1-R.4 above for a row-wise call with M, N, K > 0 that passed f.1-f.2."""
    if dtype_name(od) != "bfloat16":  # R.1
        raise ReferenceRejectsError(
            f"Only bf16 high precision output types are supported for row-wise scaling: got {od}; pass "
            f"out_dtype=torch.bfloat16 {_BLAS}"
        )
    _check_kernel_inputs(input, mat2, scale_a, scale_b, bias, out)  # R.2
    refusal = platform_refusal(profile)  # R.3
    if refusal is not None:
        raise UnsupportedFeatureError(f"row-wise scaling: {refusal}; use one-element (tensor-wise) scales, or "
                                      f"profile='hopper' {_SCOPE}")
    _check_tma_requirements(input, mat2, out)  # R.4


def _check_kernel_inputs(input, mat2, scale_a, scale_b, bias, out) -> None:
    """R.2: torch 2.7.1's ``check_inputs`` of RowwiseScaledMM.cu (the checks f.2 has not already made)."""
    K, N = mat2.shape
    if dtype_name(input.dtype) not in ("float8_e4m3fn", "float8_e5m2"):
        raise _kernel_rejects("a.dtype() == at::kFloat8_e4m3fn || a.dtype() == at::kFloat8_e5m2",
                              f"the row-wise kernel takes input as float8_e4m3fn or float8_e5m2, got {input.dtype}")
    if dtype_name(mat2.dtype) != "float8_e4m3fn":
        raise _kernel_rejects("b.dtype() == at::kFloat8_e4m3fn",
                              f"the row-wise kernel takes mat2 only as float8_e4m3fn, got {mat2.dtype}; quantise "
                              f"the weight to float8_e4m3fn (an E5M2 operand may be input)")
    if input.stride(1) != 1 or input.stride(0) < K:
        condition = "a.stride(1) == 1" if input.stride(1) != 1 else "a.stride(0) >= a.size(1)"
        raise _kernel_rejects(condition, f"input must be row-major [M, K], got strides {tuple(input.stride())} "
                                         f"(no copy is made for row-wise calls); pass input.contiguous()")
    if mat2.stride(0) != 1 or mat2.stride(1) < K:
        condition = "b.stride(0) == 1" if mat2.stride(0) != 1 else "b.stride(1) >= b.size(0)"
        raise _kernel_rejects(condition, f"mat2 must be column-major [K, N], got strides {tuple(mat2.stride())}; "
                                         f"pass w.t() for a row-major [N, K] weight w")
    if scale_a.stride(0) != 1:
        raise _kernel_rejects("scale_a.stride(0) == 1", f"scale_a has strides {tuple(scale_a.stride())}; pass "
                                                        f"scale_a.clone()")
    if scale_b.stride(1) != 1:
        raise _kernel_rejects("scale_b.stride(1) == 1", f"scale_b has strides {tuple(scale_b.stride())}; pass "
                                                        f"scale_b.clone()")
    if bias is not None and bias.dim() != 1:
        raise _kernel_rejects("bias->dim() == 1", f"bias has shape {list(bias.shape)}; pass bias.reshape(-1)")
    if bias is not None and bias.stride(0) != 1:
        raise _kernel_rejects("bias->stride(0) == 1", f"bias has stride {bias.stride(0)}; pass bias.contiguous()")
    if out is not None and tuple(out.shape) == (input.shape[0], N):  # another shape is resized to row-major first
        if out.stride(1) != 1 or out.stride(0) < N:
            condition = "out.stride(1) == 1" if out.stride(1) != 1 else "out.stride(0) >= out.size(1)"
            raise _kernel_rejects(condition, f"out= must be row-major for row-wise scaling, got strides "
                                             f"{tuple(out.stride())}; pass a contiguous out or out=None")


def _check_tma_requirements(input, mat2, out) -> None:
    """R.4: addresses and leading dimensions the kernel's TMA descriptors need (undefined otherwise)."""
    M = input.shape[0]
    requirements = [("input", input, input.stride(0), 16), ("mat2", mat2, mat2.stride(1), 16)]
    if out is not None and tuple(out.shape) == (M, mat2.shape[1]):
        requirements.append(("out", out, out.stride(0), 8))
    for name, tensor, leading, multiple in requirements:
        if byte_misalignment(tensor) or leading % multiple:
            raise UnsupportedFeatureError(
                f"row-wise scaling with {name} at a byte offset {byte_misalignment(tensor)} from a 16-byte boundary "
                f"and leading dimension {leading}: torch 2.7.1's row-wise kernel loads it through a TMA descriptor "
                f"that needs a 16-byte aligned address and a leading dimension that is a multiple of {multiple} "
                f"elements; CUTLASS does not check this, so the GPU's result is not fixed by the source; pass "
                f"{name}.contiguous() (or clone()) {_SCOPE}"
            )

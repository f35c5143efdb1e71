"""Matrix layouts as torch 2.7.1 hands them to cuBLASLt (semantics.md f.4 rules 2, 5, 6; platform.md section 2).

torch's ``prepare_matrix_for_cublas`` sorts every 2-D operand into one of three kinds:

* *row-major*: ``t.is_contiguous()``, or ``t.stride(1) == 1 and t.stride(0) >= max(1, C)`` (a padded leading
  dimension is allowed);
* *column-major*: not contiguous, ``t.stride(0) == 1 and t.stride(1) >= max(1, R)``;
* neither (for example a strided slice ``x[:, ::2]``): torch silently copies it to a contiguous tensor.

The FP8 GEMM of cuBLASLt only runs "TN": mat1 row-major [M, K] and mat2 column-major [K, N] (``w.t()`` of a
row-major [N, K] weight ``w``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the rules read only shapes, strides and offsets: a TensorDescriptor answers them too
    import torch

__all__ = [
    "is_row_major",
    "is_column_major",
    "is_neither_major",
    "mat2_is_column_major",
    "is_layout_std",
    "leading_dimensions",
    "byte_misalignment",
]


def is_row_major(t: torch.Tensor) -> bool:
    """Row-major [R, C] (f.4.2): contiguous, or unit column stride with a row stride of at least max(1, C)."""
    if t.is_contiguous():
        return True
    return t.stride(1) == 1 and t.stride(0) >= max(1, t.shape[1])


def is_column_major(t: torch.Tensor) -> bool:
    """Column-major [R, C] (f.4.2): not contiguous, unit row stride, column stride of at least max(1, R)."""
    if t.is_contiguous():
        return False
    return t.stride(0) == 1 and t.stride(1) >= max(1, t.shape[0])


def is_neither_major(t: torch.Tensor) -> bool:
    """Neither row- nor column-major: torch 2.7.1 works on a private contiguous copy of such a tensor."""
    return not is_row_major(t) and not is_column_major(t)


def mat2_is_column_major(mat2: torch.Tensor) -> bool:
    """The layout cuBLASLt accepts for mat2 [K, N] (f.4.2): ``mat2.t()`` is row-major.

    Spelled out: ``mat2.t().is_contiguous()`` or ``mat2.stride(0) == 1 and mat2.stride(1) >= max(1, K)``.
    """
    return is_row_major(mat2.t())


def is_layout_std(input: torch.Tensor, mat2: torch.Tensor) -> bool:
    """platform.md section 2: input contiguous AND mat2.t() contiguous (the layout the split-K tables were
    recorded with, leading dimension = K). Pass the input after torch's possible copy."""
    return input.is_contiguous() and mat2.t().is_contiguous()


def leading_dimensions(input: torch.Tensor, mat2: torch.Tensor) -> tuple[int, int]:
    """(lda, ldb) as torch 2.7.1 passes them to cuBLASLt (f.4.6).

    lda = input.stride(0) if M > 1 else K; ldb = mat2.stride(1) if N > 1 else K (a single row or column has
    no meaningful stride, torch uses K).
    """
    M, K = input.shape
    N = mat2.shape[1]
    lda = input.stride(0) if M > 1 else K
    ldb = mat2.stride(1) if N > 1 else K
    return lda, ldb


def byte_misalignment(t: torch.Tensor) -> int:
    """Bytes past a 16-byte boundary at which t's data starts (f.4.5); 0 when aligned.

    On CUDA the data pointer itself; elsewhere ``storage_offset() * element_size()`` (the storage is assumed
    aligned, so the check is the same on every machine).
    """
    if t.device.type == "cuda":
        return t.data_ptr() % 16
    return (t.storage_offset() * t.element_size()) % 16

"""The operands ``mmaemu explain`` plans a call on: on the CPU, operand descriptors (the shape, strides, dtype and
device of each tensor, :mod:`mmaemu.plan.descriptors`), so that explaining needs no torch; on a CUDA device, zero
tensors with the shape, strides, dtype, device and alignment of the call, that need no memory when they are large
(explain reads no element).

No click here: this is library logic that ``mmaemu explain`` needs and the library does not offer yet.
"""

from __future__ import annotations

import warnings

from .. import formats
from ..plan.descriptors import DeviceDescriptor, TorchName, row_major

FP8_DTYPES = formats.TORCH_NAMES
OUT_DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
              "fp16": "float16", "float16": "float16", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
#: Operands up to this many bytes are ordinary zero tensors; larger CPU operands are zero pages mapped read-only
#: (no memory is committed), larger CUDA operands views of a small allocation (explain never reads them).
SMALL_OPERAND_BYTES = 64 << 20
#: The CPU, as explain plans on it: a device descriptor (no torch).
CPU = DeviceDescriptor("cpu")


def zero_rows(rows: int, cols: int, dtype, device):
    """A zero-filled row-major [rows, cols] tensor, 16-byte aligned, that does not need rows*cols bytes of
    memory when it is large."""
    import torch

    if rows * cols <= SMALL_OPERAND_BYTES:
        return torch.zeros((rows, cols), dtype=torch.uint8, device=device).view(dtype)
    if device.type == "cpu":
        return _zero_pages(rows, cols, dtype)
    return _cuda_view(rows, cols, dtype, device)


def _zero_pages(rows: int, cols: int, dtype):
    """A CPU [rows, cols] tensor over private read-only anonymous pages: they read as zeros and commit no memory
    (the zero page backs them)."""
    import mmap

    import numpy as np
    import torch

    buf = mmap.mmap(-1, rows * cols, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ)
    array = np.frombuffer(buf, dtype=np.uint8).reshape(rows, cols)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that the array is not writable: explain never writes
        return torch.from_numpy(array).view(dtype)


class _CudaArray:
    """A ``__cuda_array_interface__`` describing a [rows, cols] uint8 array at ``ptr`` (no bounds of its own)."""

    def __init__(self, ptr: int, rows: int, cols: int, keep):
        self._keep = keep
        self.__cuda_array_interface__ = {"shape": (rows, cols), "strides": (cols, 1), "typestr": "|u1",
                                         "data": (ptr, True), "version": 2}


def _cuda_view(rows: int, cols: int, dtype, device):
    """A [rows, cols] CUDA tensor over a 4 KiB zero allocation: it has the shape, strides, device and alignment
    explain looks at, but not the memory (explain reads no element; nothing else may use it)."""
    import torch

    backing = torch.zeros(4096, dtype=torch.uint8, device=device)
    view = torch.as_tensor(_CudaArray(backing.data_ptr(), rows, cols, backing), device=device)
    return view.view(dtype)


def explain_call(M, N, K, a, b, out, fast, scale_a, scale_b, scale_result, profile, splitk, backend, device):
    """The CallPlan of a scaled_mm call with operands of the given shape on ``device`` (``a``, ``b``: keys of
    FP8_DTYPES; ``out``: a key of OUT_DTYPES or None): operand descriptors on a device descriptor (the CPU), else
    zero-filled torch tensors. Both describe a contiguous input [M, K], a mat2 [K, N] that is the transpose of a
    contiguous [N, K] and one-element float32 scales, so the plan is the same."""
    if isinstance(device, DeviceDescriptor):
        return _explain_described(M, N, K, a, b, out, fast, scale_a, scale_b, scale_result, profile, splitk,
                                  backend, device)
    import torch

    import mmaemu

    input = zero_rows(M, K, formats.DTYPE_OF[a], device)
    mat2 = zero_rows(N, K, formats.DTYPE_OF[b], device).t()
    scalar = lambda x: torch.tensor(x, dtype=torch.float32, device=device)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # explain records every warning in the plan; do not print them twice
        return mmaemu.explain(
            input, mat2, scalar(scale_a), scalar(scale_b), scale_result=None if scale_result is None else
            scalar(scale_result), out_dtype=None if out is None else getattr(torch, OUT_DTYPES[out]),
            use_fast_accum=fast, profile=profile, splitk=splitk, backend=backend)


def _explain_described(M, N, K, a, b, out, fast, scale_a, scale_b, scale_result, profile, splitk, backend, device):
    """explain_call on operand descriptors: the planner reads only metadata, so no torch is imported. The scale
    values are not part of the plan (explain reads no element), as with the zero tensors of a CUDA call."""
    from ..context import for_call
    from ..plan.planner import explain_scaled_mm

    input = row_major((M, K), TorchName(formats.TORCH_NAMES[a]), device)
    mat2 = row_major((N, K), TorchName(formats.TORCH_NAMES[b]), device).t()
    scalar = row_major((), TorchName("float32"), device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # explain records every warning in the plan; do not print them twice
        return explain_scaled_mm(
            input, mat2, scalar, scalar, scale_result=None if scale_result is None else scalar,
            out_dtype=None if out is None else TorchName(OUT_DTYPES[out]), use_fast_accum=fast, profile=profile,
            splitk=splitk, backend=backend, context=for_call())

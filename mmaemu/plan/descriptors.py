"""Operand descriptors: the metadata of a tensor that planning reads (shape, strides, dtype, device, storage
offset), as plain data, so that a call can be planned without importing torch (``mmaemu explain`` on the CPU).

A :class:`TensorDescriptor` answers the questions validation asks of a torch.Tensor (``shape``, ``dtype``,
``device``, ``stride()``, ``is_contiguous()``, ``t()``, ``storage_offset()``, ...) as torch answers them for a
dense tensor with that metadata that does not require grad. It holds no elements: it plans a call, and no backend
computes on it. Its dtype, layout and device print as torch prints them ("torch.float8_e4m3fn", "torch.strided",
"cpu"), so every message of the planner reads the same for a descriptor as for the tensor it describes.

Validation tells a dtype by its name (:func:`dtype_name`), which a torch dtype and a :class:`TorchName` share.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from ..formats import dtype_name

__all__ = ["TorchName", "DeviceDescriptor", "TensorDescriptor", "dtype_name", "is_descriptor", "row_major"]

#: Bytes per element of the dtypes a scaled_mm call can name (torch's element_size()).
ELEMENT_BYTES = {"float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
                 "float8_e8m0fnu": 1, "uint8": 1, "int8": 1, "bfloat16": 2, "float16": 2, "float32": 4,
                 "float64": 8}


@dataclasses.dataclass(frozen=True)
class TorchName:
    """A torch dtype or layout by name ("float8_e4m3fn"), printed as torch prints it ("torch.float8_e4m3fn")."""

    name: str

    def __str__(self) -> str:
        return f"torch.{self.name}"

    __repr__ = __str__


STRIDED = TorchName("strided")


@dataclasses.dataclass(frozen=True)
class DeviceDescriptor:
    """A device by kind and index, printed as torch prints a device ("cpu", "cuda:0")."""

    type: str
    index: Optional[int] = None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


@dataclasses.dataclass(frozen=True)
class TensorDescriptor:
    """A dense tensor's metadata: ``shape``, ``strides`` (elements), ``dtype`` (a :class:`TorchName`),
    ``device`` (a :class:`DeviceDescriptor`) and ``offset`` (its storage offset, elements)."""

    shape: Tuple[int, ...]
    strides: Tuple[int, ...]
    dtype: TorchName
    device: DeviceDescriptor
    offset: int = 0

    requires_grad = False
    is_nested = False
    layout = STRIDED

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    def stride(self, dim: Optional[int] = None):
        return self.strides if dim is None else self.strides[dim]

    def storage_offset(self) -> int:
        return self.offset

    def element_size(self) -> int:
        return ELEMENT_BYTES[self.dtype.name]

    def is_contiguous(self) -> bool:
        """torch's rule: every dimension longer than 1 has the row-major stride; an empty tensor is contiguous."""
        if self.numel() == 0:
            return True
        return all(size == 1 or stride == expected
                   for size, stride, expected in zip(self.shape, self.strides, _row_major_strides(self.shape)))

    def t(self) -> "TensorDescriptor":
        """The transpose of a matrix (a tensor of fewer than 2 dimensions is its own transpose), as a view."""
        if self.dim() < 2:
            return self
        return dataclasses.replace(self, shape=self.shape[::-1], strides=self.strides[::-1])

    def contiguous(self) -> "TensorDescriptor":
        """The row-major copy torch makes of a tensor that is not contiguous."""
        if self.is_contiguous():
            return self
        return row_major(self.shape, self.dtype, self.device)


def _row_major_strides(shape) -> Tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def row_major(shape, dtype: TorchName, device: DeviceDescriptor) -> TensorDescriptor:
    """A contiguous (row-major) tensor of ``shape`` at storage offset 0."""
    shape = tuple(shape)
    return TensorDescriptor(shape, _row_major_strides(shape), dtype, device)


def is_descriptor(value) -> bool:
    return isinstance(value, TensorDescriptor)

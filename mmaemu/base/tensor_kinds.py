"""Which tensors mmaemu can compute on: dense (strided) tensors that hold data.

Sparse tensors (COO, CSR, ...) and nested tensors have no single [rows, columns] layout of FP8 codes: they are
refused with a TypeError before any other rule looks at them (:func:`require_dense`). A meta tensor has shapes,
strides and a device like any other, so the validation rules of the call apply to it first (torch validates meta
calls too); it is refused afterwards, because it holds no data to compute on (:func:`require_data`). Both refusals
happen before anything is computed, so :func:`mmaemu.explain` reports them.
"""

from __future__ import annotations

__all__ = ["require_dense", "require_data"]

_RULE = "mmaemu computes only on dense (strided) tensors with data on the CPU or a CUDA device"


def require_dense(caller: str, name: str, tensor) -> None:
    """TypeError("<caller>: <name> is a sparse_coo / nested ... tensor; ...") unless ``tensor`` is strided."""
    if tensor.is_nested:
        what, way_out = "a nested tensor", "pass its components one by one (tensor.unbind())"
    elif str(tensor.layout) != "torch.strided":  # by name: no torch import for an operand descriptor
        what, way_out = f"a {str(tensor.layout).replace('torch.', '')} tensor", "pass tensor.to_dense()"
    else:
        return
    raise TypeError(f"{caller}: {name} is {what}; {_RULE}: {way_out}")


def require_data(caller: str, name: str, tensor) -> None:
    """TypeError("<caller>: <name> is a meta tensor; ...") for a tensor on the meta device."""
    if tensor.device.type == "meta":
        raise TypeError(f"{caller}: {name} is a meta tensor (it holds no data); {_RULE}: pass a tensor with data, "
                        f"e.g. torch.zeros of the same shape and dtype")

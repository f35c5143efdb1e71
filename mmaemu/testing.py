"""Assertions on bit patterns (platform.md section 8), in the manner of ``numpy.testing``.

``assert_bitwise_equal`` explains a mismatch: how many elements differ in each class (zero_sign, nan_payload,
value) and the first ten, with index, value and hex bits of both sides.
"""

from __future__ import annotations

import numpy as np

from .formats import dtype_name

__all__ = ["bits", "assert_bitwise_equal"]

_INT_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
_SHOWN = 10


def bits(t):
    """Integer view of a tensor or array with the same element size (uint8/int16/int32/int64), no copy.

    Same shape and device; complex dtypes are refused (TypeError).
    """
    if isinstance(t, np.ndarray):
        if np.iscomplexobj(t):
            raise TypeError("bits: complex arrays have no single bit pattern per element")
        return t.view(np.dtype(_INT_OF_SIZE[t.dtype.itemsize]))
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"bits: expected a torch.Tensor or numpy.ndarray, got {type(t).__name__}")
    if t.is_complex():
        raise TypeError("bits: complex tensors have no single bit pattern per element")
    return t.view(getattr(torch, _INT_OF_SIZE[t.element_size()]))


def _as_numpy(x):
    if isinstance(x, np.ndarray):
        return x
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    raise TypeError(f"expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def _float_view(x, raw_bits):
    """Float values for display and NaN/zero classification (float8/bfloat16 through torch)."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind == "f":
            return x.astype(np.float64)
        return raw_bits.astype(np.float64)
    if x.is_floating_point():
        return x.to(__import__("torch").float64).numpy()
    return x.numpy().astype(np.float64)


def _dtype_name(x):
    return dtype_name(x.dtype)


def assert_bitwise_equal(actual, expected, *, nan="bits", msg=""):
    """Assert identical bit patterns; same dtype and shape required.

    ``nan="bits"``: NaN payloads must match; ``nan="mask"``: NaN positions must match, payloads ignored.
    On failure the AssertionError counts mismatches per class - zero_sign (both zero, other sign),
    nan_payload (both NaN, other bits), value (everything else, NaN vs non-NaN included) - and lists the first
    ten with index, value and hex bits of both sides.
    """
    if nan not in ("bits", "mask"):
        raise ValueError(f"nan must be 'bits' or 'mask', got {nan!r}")
    a, e = _as_numpy(actual), _as_numpy(expected)
    prefix = f"{msg}: " if msg else ""
    if _dtype_name(a) != _dtype_name(e):
        raise AssertionError(f"{prefix}dtype mismatch: actual {_dtype_name(a)}, expected {_dtype_name(e)}")
    if tuple(a.shape) != tuple(e.shape):
        raise AssertionError(f"{prefix}shape mismatch: actual {tuple(a.shape)}, expected {tuple(e.shape)}")
    a_bits, e_bits = np.asarray(bits(a)), np.asarray(bits(e))
    av, ev = _float_view(a, a_bits), _float_view(e, e_bits)
    a_nan, e_nan = np.isnan(av), np.isnan(ev)
    differ = a_bits != e_bits
    if nan == "mask":
        differ &= ~(a_nan & e_nan)
    if not differ.any():
        return
    classes = {
        "zero_sign": differ & (av == 0) & (ev == 0),
        "nan_payload": differ & a_nan & e_nan,
    }
    classes["value"] = differ & ~classes["zero_sign"] & ~classes["nan_payload"]
    raise AssertionError(prefix + _report(differ, classes, av, ev, a_bits, e_bits))


def _report(differ, classes, av, ev, a_bits, e_bits):
    width = a_bits.dtype.itemsize * 2
    mask = (1 << (8 * a_bits.dtype.itemsize)) - 1
    total = int(differ.sum())
    counts = ", ".join(f"{name}={int(m.sum())}" for name, m in classes.items())
    lines = [f"bit patterns differ at {total} of {differ.size} elements ({counts})"]
    for index in list(zip(*np.nonzero(differ)))[:_SHOWN]:
        index = tuple(int(i) for i in index)
        lines.append(
            f"  at {index}: actual {float(av[index])} (0x{int(a_bits[index]) & mask:0{width}X}), "
            f"expected {float(ev[index])} (0x{int(e_bits[index]) & mask:0{width}X})"
        )
    if total > _SHOWN:
        lines.append(f"  ... and {total - _SHOWN} more")
    return "\n".join(lines)

"""``mmaemu.model.dot``: the instruction-level model (semantics.md f.9, b.4).

One chain of the preset's blocks over the last axis, from an accumulator c (+0 by default). This is what one
tensor-core instruction (K = 32 for the Khattak-Mikaitis vectors) or a sequence of them computes; it is not a
GEMM (no slow restarts, no split-K, no epilogue).
"""

from __future__ import annotations

import numpy as np

from .. import formats
from ..cpu.dot import dot_codes
from ..base.fpmode import check_no_flush_to_zero
from ..base.tensor_kinds import require_data, require_dense
from .block_scaled import dot_block_scaled
from .presets import get_preset

CANONICAL_NAN_F32 = np.uint32(0x7FFFFFFF)


def dot(a, b, c=None, *, preset="ada", fmt=None, scale_a=None, scale_b=None, scale_fmt=None):
    """fp32 result of one chain per leading index: ``a`` and ``b`` of identical shape [..., K].

    ``a``/``b``: float8 tensors (format from the dtype) or float64 tensors holding FP8 values with
    ``fmt = "e4m3" | "e5m2" | (fmt_a, fmt_b)``. ``c``: None (+0) or an fp32 (or float64 holding fp32 values)
    tensor of shape [...]. Any format pair is accepted (E5M2 x E5M2 included). NaN/Inf inputs or c propagate
    as IEEE arithmetic does (b.4); any NaN result is the canonical 0x7FFFFFFF. Refused like scaled_mm and
    accumulate: meta, sparse or nested tensors (TypeError) and, when something is computed, a CPU thread that
    flushes subnormals to zero (MmaemuError: the results would silently differ). 0-D inputs have no K axis
    (ValueError).

    Block-scaled presets (``tcgen05_mxf8f6f4``, ``sm120_mxf8f6f4``, ``tcgen05_mxf4nvf4``, ``sm120_mxf4nvf4``;
    semantics.md b.5) take ``scale_a`` and ``scale_b``: one scale per block of the last axis, shape [..., K / block]
    (``float8_e8m0fnu`` for UE8M0, ``float8_e4m3fn`` read as UE4M3, or uint8 codes with ``scale_fmt``), and
    operands in FP8, FP6 or FP4 (``float4_e2m1fn_x2``, or uint8 codes with ``fmt``): see
    :mod:`mmaemu.model.block_scaled`. Other presets refuse scales.
    """
    import torch

    preset = get_preset(preset)
    _check_tensors(a, b, c)
    if preset.block_scaled:
        lead_shape = tuple(a.shape[:-1])
        c32 = _accumulator(c, lead_shape)
        out = dot_block_scaled(preset, a, b, c32, fmt, scale_a, scale_b, scale_fmt, lead_shape)
        return torch.from_numpy(out.reshape(lead_shape))
    if scale_a is not None or scale_b is not None or scale_fmt is not None:
        raise TypeError(f"dot: preset {preset.name!r} is not block-scaled and takes no scales; the block-scaled "
                        "presets are tcgen05_mxf8f6f4, sm120_mxf8f6f4, tcgen05_mxf4nvf4 and sm120_mxf4nvf4")
    fmt_a, fmt_b = _formats(a, b, fmt)
    a_codes = _codes(a, fmt_a, "a")
    b_codes = _codes(b, fmt_b, "b")
    if a_codes.shape != b_codes.shape:
        raise ValueError(f"dot: a and b must have identical shapes (no broadcasting), got {a_codes.shape} and "
                         f"{b_codes.shape}")
    lead_shape, K = a_codes.shape[:-1], a_codes.shape[-1]
    c32 = _accumulator(c, lead_shape)
    rows = int(np.prod(lead_shape))
    a2 = a_codes.reshape(rows, K)
    b2 = b_codes.reshape(rows, K)
    if K == 0:  # a chain of no blocks applies no block step: c comes back unchanged (NaN made canonical)
        out = c32.reshape(-1).copy()
        out.view(np.uint32)[np.isnan(out)] = CANONICAL_NAN_F32
        return torch.from_numpy(out.reshape(lead_shape))
    check_no_flush_to_zero()
    out = dot_codes(a2, b2, c32.reshape(-1), fmt_a, fmt_b, preset)
    _propagate_specials(out, a2, b2, c32.reshape(-1), fmt_a, fmt_b)
    return torch.from_numpy(out.reshape(lead_shape))


def _check_tensors(a, b, c):
    """Tensors with data and one dense layout, a and b with a K axis (f.9); other types are refused later."""
    import torch

    for name, x in (("a", a), ("b", b), ("c", c)):
        if isinstance(x, torch.Tensor):
            require_dense("dot", name, x)
            require_data("dot", name, x)
    for name, x in (("a", a), ("b", b)):
        if isinstance(x, torch.Tensor) and x.dim() == 0:
            raise ValueError(f"dot: {name} must have at least one dimension [..., K] (the last one is K), got a 0-D "
                             f"tensor; pass x.reshape(1) for a chain of one element")


def _formats(a, b, fmt):
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and formats.is_fp8_dtype(a.dtype) \
            and formats.is_fp8_dtype(b.dtype):
        return formats.fmt_of(a.dtype), formats.fmt_of(b.dtype)
    if fmt is None:
        raise TypeError("dot: a and b are not float8 tensors, so fmt='e4m3' | 'e5m2' | (fmt_a, fmt_b) is required")
    pair = (fmt, fmt) if isinstance(fmt, str) else tuple(fmt)
    if len(pair) != 2 or any(f not in formats.FORMATS for f in pair):
        raise ValueError(f"dot: fmt must be 'e4m3', 'e5m2' or a pair of them, got {fmt!r}")
    return pair


def _codes(x, fmt, name):
    """uint8 FP8 codes of a float8 tensor, or of a float64 tensor whose values must be exactly representable."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"dot: {name} must be a torch.Tensor, got {type(x).__name__}")
    if formats.is_fp8_dtype(x.dtype):
        if formats.fmt_of(x.dtype) != fmt:
            raise ValueError(f"dot: {name} has dtype {x.dtype} but fmt says {fmt!r}")
        return x.detach().cpu().contiguous().view(torch.uint8).numpy()
    if x.dtype != torch.float64:
        raise TypeError(f"dot: {name} must be a float8 tensor or a float64 tensor holding FP8 values, "
                        f"got {x.dtype}")
    values = x.detach().cpu().numpy()
    codes = formats.DTYPE_OF[fmt]
    encoded = x.detach().cpu().to(codes).view(torch.uint8).numpy()
    back = formats.decode(encoded, fmt)
    same = (back == values) | (np.isnan(back) & np.isnan(values))
    same &= np.signbit(back) == np.signbit(values)
    if not same.all():
        bad = values[~same].reshape(-1)[0]
        raise ValueError(f"dot: {name} holds {bad!r}, which is not exactly representable in {fmt}")
    return encoded


def _accumulator(c, lead_shape):
    """c as a float32 array of the leading shape (+0 when None); float64 input must hold fp32 values."""
    import torch

    if c is None:
        return np.zeros(lead_shape, np.float32)
    if not isinstance(c, torch.Tensor):
        raise TypeError(f"dot: c must be None or a torch.Tensor, got {type(c).__name__}")
    if tuple(c.shape) != tuple(lead_shape):
        raise ValueError(f"dot: c must have shape {tuple(lead_shape)}, got {tuple(c.shape)}")
    if c.dtype == torch.float32:
        return c.detach().cpu().numpy().astype(np.float32)
    if c.dtype != torch.float64:
        raise TypeError(f"dot: c must be float32 (or float64 holding fp32 values), got {c.dtype}")
    c64 = c.detach().cpu().numpy()
    c32 = c64.astype(np.float32)
    if not np.array_equal(c32.astype(np.float64), c64, equal_nan=True):
        raise ValueError("dot: c holds float64 values that are not exactly representable in fp32")
    return c32


def _propagate_specials(out, a2, b2, c32, fmt_a, fmt_b):
    """Rows with a NaN/Inf input or c take the IEEE value of c + sum(a*b) in float64 (b.4).

    Our reading of b.4: the float64 evaluation of the block formula lets Inf and NaN through as IEEE
    arithmetic does, so a row is NaN if it holds a NaN, an Inf * 0, or infinities of both signs (c included),
    and +-Inf otherwise; finite sums cannot overflow float64, so this is the class of the exact sum.
    """
    rows = formats.nonfinite_mask(a2, fmt_a).any(-1) | formats.nonfinite_mask(b2, fmt_b).any(-1)
    rows |= ~np.isfinite(c32)
    if not rows.any():
        return
    with np.errstate(invalid="ignore", over="ignore"):
        products = formats.decode(a2[rows], fmt_a) * formats.decode(b2[rows], fmt_b)
        total = c32[rows].astype(np.float64) + products.sum(-1)
    special = total.astype(np.float32)
    bits = special.view(np.uint32)
    bits[np.isnan(special)] = CANONICAL_NAN_F32
    out[rows] = special

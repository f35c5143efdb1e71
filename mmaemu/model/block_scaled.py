"""``mmaemu.model.dot`` for the block-scaled presets (semantics.md b.5): operands, scales and the chain.

A row of K elements is a chain of K / k instructions of the preset (k = ``preset.nfma``), each from the fp32 result
of the one before. Scales: one per ``block`` elements of K, ``block = K / scales.shape[-1]``, a (block, format)
pair the preset accepts. Operands: float8 tensors, ``float4_e2m1fn_x2`` tensors (two codes per byte, low nibble
first; the last axis holds K / 2 bytes), or uint8 tensors of one code per element with ``fmt`` naming the format
(FP6 has no torch dtype). Scales: ``float8_e8m0fnu`` (UE8M0) or ``float8_e4m3fn`` read as UE4M3 (sign bit ignored,
NVFP4's convention), or uint8 codes with ``scale_fmt``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import formats
from ..cpu.block_scaled import canonical_nan, chain_operands, run_scaled_rows
from ..base.fpmode import check_no_flush_to_zero
_SCALE_DTYPES = {"float8_e8m0fnu": "ue8m0", "float8_e4m3fn": "ue4m3"}


class Operand(NamedTuple):
    """Element codes [rows, K] (uint8) and their format."""

    codes: np.ndarray
    fmt: str


class Scales(NamedTuple):
    """Scale codes [rows, K / block] (uint8), their format and the block length in elements of K."""

    codes: np.ndarray
    fmt: str
    block: int


def operand(x, fmt, name) -> Operand:
    """The element codes of ``x`` as a 2-D array [rows, K] and the format (see the module docstring)."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"dot: {name} must be a torch.Tensor, got {type(x).__name__}")
    dtype = formats.dtype_name(x.dtype)
    raw = x.detach().cpu().contiguous()
    if dtype == "float4_e2m1fn_x2":
        found, codes = "e2m1", formats.unpack_fp4(raw.view(torch.uint8).numpy())
    elif formats.is_fp8_dtype(x.dtype):
        found, codes = formats.fmt_of(x.dtype), raw.view(torch.uint8).numpy()
    elif dtype == "uint8":
        if fmt is None:
            raise TypeError(f"dot: {name} holds uint8 codes, so fmt= must name their format "
                            f"(one of {formats.OPERAND_FORMATS})")
        found, codes = fmt, raw.numpy()
    else:
        raise TypeError(f"dot: {name} of a block-scaled preset must be a float8, float4_e2m1fn_x2 or uint8 (codes) "
                        f"tensor, got {x.dtype}")
    if fmt is not None and fmt != found:
        raise ValueError(f"dot: {name} is {found} but fmt says {fmt!r}")
    if found not in formats.OPERAND_FORMATS:
        raise ValueError(f"dot: unknown operand format {found!r}; expected one of {formats.OPERAND_FORMATS}")
    formats.decode(codes, found)  # refuses codes beyond the format's width
    return Operand(np.ascontiguousarray(codes.reshape(-1, codes.shape[-1]) if codes.ndim else codes), found)


def scales(x, scale_fmt, name, K, lead_shape) -> Scales:
    """The scale codes of ``x`` [..., K / block] and their block length."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"dot: {name} must be a torch.Tensor of scales, got {type(x).__name__}")
    dtype = formats.dtype_name(x.dtype)
    if dtype in _SCALE_DTYPES:
        fmt = _SCALE_DTYPES[dtype]
        if scale_fmt is not None and scale_fmt != fmt:
            raise ValueError(f"dot: {name} has dtype {x.dtype} ({fmt}) but scale_fmt says {scale_fmt!r}")
    elif dtype == "uint8" and scale_fmt in formats.SCALE_FORMATS:
        fmt = scale_fmt
    else:
        raise TypeError(f"dot: {name} must be float8_e8m0fnu (UE8M0), float8_e4m3fn (UE4M3) or uint8 codes with "
                        f"scale_fmt in {formats.SCALE_FORMATS}, got {x.dtype}")
    if tuple(x.shape[:-1]) != tuple(lead_shape) or x.dim() == 0 or x.shape[-1] == 0 or K % x.shape[-1]:
        raise ValueError(f"dot: {name} must have shape {tuple(lead_shape)} + (K / block,) with K = {K}, got "
                         f"{tuple(x.shape)}")
    codes = x.detach().cpu().contiguous().view(torch.uint8).numpy().reshape(-1, x.shape[-1])
    return Scales(np.ascontiguousarray(codes), fmt, K // x.shape[-1])


def check_kinds(preset, a: Operand, b: Operand, sa: Scales, sb: Scales, K: int) -> None:
    """The instruction's rules: operand formats, (block, scale format) pairs, K a whole number of instructions."""
    for name, op in (("a", a), ("b", b)):
        if op.fmt not in preset.operand_formats:
            raise ValueError(f"dot: preset {preset.name!r} takes operands in {preset.operand_formats}; {name} is "
                             f"{op.fmt}")
    if (sa.block, sa.fmt) != (sb.block, sb.fmt):
        raise ValueError(f"dot: scale_a ({sa.fmt}, one per {sa.block}) and scale_b ({sb.fmt}, one per {sb.block}) "
                         "must have the same format and block length")
    if (sa.block, sa.fmt) not in preset.scale_kinds:
        accepted = ", ".join(f"one {f} per {blk}" for blk, f in preset.scale_kinds)
        raise ValueError(f"dot: preset {preset.name!r} takes scales {accepted}; got one {sa.fmt} per {sa.block} "
                         "elements of K")
    if K % preset.nfma:
        raise ValueError(f"dot: K = {K} is not a whole number of {preset.name!r} instructions (k = {preset.nfma})")


def _specials(ops, sa: Scales, k: int):
    """(float64 sum of the scaled products per row and instruction, where the instruction holds a NaN/Inf element
    or a NaN scale: the IEEE value such an instruction adds to its accumulator; those flags)."""
    has = ops.a.bad | ops.b.bad
    rows, K = ops.a.value.shape
    special = np.zeros(has.shape, np.float64)
    if has.any():
        with np.errstate(invalid="ignore", over="ignore"):
            scale = np.repeat(ops.a.scale_value * ops.b.scale_value, sa.block, axis=1)
            terms = ops.a.value * ops.b.value * scale
            special = terms.reshape(rows, K // k, k).sum(-1)
    return special, has


def dot_block_scaled(preset, a, b, c32, fmt, scale_a, scale_b, scale_fmt, lead_shape):
    """fp32 results [rows] of the chains of ``preset``'s instructions (see the module docstring)."""
    fmt_a, fmt_b = (fmt, fmt) if fmt is None or isinstance(fmt, str) else tuple(fmt)
    op_a, op_b = operand(a, fmt_a, "a"), operand(b, fmt_b, "b")
    if op_a.codes.shape != op_b.codes.shape:
        raise ValueError(f"dot: a and b must hold the same number of elements per row, got {op_a.codes.shape} and "
                         f"{op_b.codes.shape}")
    rows, K = op_a.codes.shape
    if scale_a is None or scale_b is None:
        raise TypeError(f"dot: preset {preset.name!r} is block-scaled: scale_a= and scale_b= are required")
    sa, sb = (scales(s, scale_fmt, name, K, lead_shape) for s, name in ((scale_a, "scale_a"), (scale_b, "scale_b")))
    check_kinds(preset, op_a, op_b, sa, sb, K)
    c = c32.reshape(-1)
    out = np.empty(rows, np.float32)
    if K == 0 or rows == 0:
        out[:] = c
        return canonical_nan(out)
    check_no_flush_to_zero()
    ops = chain_operands(op_a.codes, op_b.codes, op_a.fmt, op_b.fmt, sa.codes, sb.codes, sa.fmt, sa.block, preset)
    special, has = _specials(ops, sa, preset.nfma)
    run_scaled_rows(ops, c, special, has, out)
    return canonical_nan(out)

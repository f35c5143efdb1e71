"""MX and NVFP4 quantisation of a tensor, as torchao 0.18.0 computes it (experimental: modelled from source).

Both recipes cut the last axis of ``x`` into blocks (32 elements for MX, 16 for NVFP4), give each block one scale
and round ``x / scale`` to the element format. Sources: the OCP Microscaling Formats (MX) specification v1.0,
section 6.3 (the shared scale ``X = 2**(floor(log2(amax)) - emax_elem)``, elements ``quantize(V / X)``), and
torchao 0.18.0 (the PyPI wheel ``torchao-0.18.0-cp310-abi3``), ``torchao/prototype/mx_formats/mx_tensor.py``
(``to_mx``), ``nvfp4_tensor.py`` (``nvfp4_quantize``, ``per_tensor_amax_to_scale``), ``config.py``
(``ScaleCalculationMode``) and ``constants.py``, which fix every detail the specification leaves open. Where
torchao departs from the specification, mmaemu follows torchao and says so below.

**MX** (:func:`quantize_mx`; elements e4m3, e5m2, e2m3, e3m2, e2m1; UE8M0 scales). With ``amax`` the largest
``|x|`` of the block in fp32 (NaN if the block holds a NaN) and ``emax_elem`` the exponent of the element format's
largest power of two (e4m3 8, e5m2 15, e2m3 2, e3m2 4, e2m1 2), the scale exponent is ``E - emax_elem`` clamped to
[-127, 127], where ``E`` depends on ``scaling_mode`` (torchao's ``ScaleCalculationMode``):

* ``"floor"`` (the OCP specification's rule, torchao's default): ``E = floor(log2(amax))``;
* ``"ceil"``: ``E = ceil(log2(amax))``;
* ``"even"``: ``E = floor(log2(amax'))``, ``amax'`` being amax rounded to ``MANT_BITS[fmt]`` fraction bits, ties
  away from zero.

``E`` is read from amax's fp32 exponent field: an all-zero block and an fp32-subnormal amax take E = -127 (scale
code 0 after the clamp); an infinite amax takes E = 128 (so a finite scale, 2**(128 - emax_elem): torchao 0.18.0
does not map Inf to the NaN scale; later torchao versions do). A NaN in the block gives the NaN scale code 0xFF.
``"rceil"`` is refused: torchao 0.18.0 computes it with a floating ``log2`` whose rounding near powers of two is
the device's, and later versions changed the rule (:class:`BlockQuantizeError`).

Each element is ``fp32(x / d)`` rounded to nearest, ties to even, saturating at the format's largest finite value
(the OCP rule for normal values above the maximum; ±Inf saturates too), where ``d = 2**(code - 127)``, except:
scale code 0 divides by 2**-126 (torchao clamps the fp32 divisor to the smallest normal, so such a block
dequantises to half its value with the stored scale 2**-127: torchao's behaviour, kept); the NaN scale divides by
+Inf (finite elements give signed zeros).

**NVFP4** (:func:`quantize_nvfp4`; e2m1 elements, UE4M3 scales per 16, an optional fp32 global scale ``g``).
``b = fp32(amax * fp32(1 / 6))``: torchao's ``max_abs / 6.0`` divides a tensor by a Python number, which torch's
CUDA kernel computes as a multiplication by the fp32 reciprocal (:mod:`mmaemu.base.gpu_torch_ops`; the CPU kernel's
true division gives other bits for a third of the amaxes). Without a global scale:
``s = e4m3(clamp(b, 2**-6, 448))`` and the elements are ``e2m1(clamp(fp32(x * fp32(1 / s)), -6, 6))``. With one:
``s = e4m3(clamp(fp32(b / g), 2**-6, 448))`` and the elements are
``e2m1(clamp(fp32(x * fp32(fp32(1 / g) / s)), -6, 6))``. The dynamic global scale (torchao's
``per_tensor_amax_to_scale``, ``amax / (448.0 * 6.0)``) is ``g = fp32(amax_tensor * fp32(1 / 2688))``, the CUDA
kernel's division by a Python number again. ``fp32(1 / g)``, ``fp32(1 / s)`` and ``b / g`` are reciprocals and
divisions of tensors by tensors: correctly rounded on CPU and CUDA alike. Each cast rounds to nearest even; the
clamps precede it. A NaN amax gives the NaN scale 0x7F; a zero global scale (an all-zero tensor with the
dynamic choice) gives NaN scales, as torchao computes them. The dequantised value is ``e2m1 * s * g``; ``g`` goes
into ``_scaled_mm``'s alpha (the product of both operands' global scales).

**Zero blocks and subnormals.** An all-zero MX block takes scale code 0 (2**-127) and zero elements; an all-zero
NVFP4 block the smallest clamped scale 2**-6 (code 0x08) and zero elements. Subnormal element values are kept
(gradual underflow onto the format's subnormal grid, rounded to nearest even like the normals), and fp32-subnormal
inputs are exact operands throughout.

**Special element codes.** A negative value that rounds to zero keeps its sign (code 0x80 for FP8, the sign bit of
FP6/FP4). NaN elements (only in a NaN-scale block; the block decodes to NaN whatever its codes) get the code 0x7F
in FP8 and 0 in FP6/FP4, which have no NaN; torchao leaves those FP6/FP4 codes unspecified and keeps the NaN's
sign in FP8.

Everything is computed in IEEE fp32 on the CPU (numpy), after widening bf16/fp16 inputs exactly, as torchao's eager
torch operations compute it on the reference GPU (the B200): the two divisions by Python numbers above as CUDA
computes them, every other operation (amax, the clamps, the reciprocals, the divisions by a tensor of powers of two
or of scales, the bit manipulations of the MX exponent, the casts) exact or correctly rounded on both devices
(docs/semantics.md, section 13); results go back to the input's device. Refused on a CPU
thread in flush-to-zero mode.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np

from . import formats, scale_layout
from .errors import MmaemuError
from .base.gpu_torch_ops import divide_by_number, reciprocal_of_number
from .platform.block_scaled import RECIPES

__all__ = ["MX_FORMATS", "SCALING_MODES", "BlockQuantized", "BlockQuantizeError", "quantize_mx", "mx_scale_codes",
           "quantize_nvfp4", "nvfp4_global_scale", "round_to_format", "dequantize_blocks"]

MX_FORMATS = ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1")
SCALING_MODES = ("floor", "ceil", "even")
MX_BLOCK, NVFP4_BLOCK = RECIPES["mxfp8"].block, RECIPES["nvfp4"].block  # the one table of the variants
#: Exponent of the largest power of two of each element format (torchao's ``*_MAX_POW2``).
EMAX_ELEM = {"e4m3": 8, "e5m2": 15, "e2m3": 2, "e3m2": 4, "e2m1": 2}
E8M0_BIAS, E8M0_NAN = 127, 0xFF
UE4M3_MIN, UE4M3_MAX = np.float32(2.0 ** -6), np.float32(448.0)
FP4_MAX = np.float32(6.0)
NVFP4_GLOBAL_DIVISOR = np.float32(448.0 * 6.0)
_FP32_MANT_BITS = 23
_SMALLEST_NORMAL_CODE = 1  # the fp32 divisor of scale code 0 (torchao clamps 2**-127 to 2**-126)


class BlockQuantizeError(MmaemuError, ValueError):
    """A block quantisation mmaemu does not model or an input it cannot quantise."""


class BlockQuantized(NamedTuple):
    """A block-quantised tensor.

    ``codes``: element codes [..., K] (FP8 as float8 tensors or uint8 arrays, FP6 as uint8), FP4 packed two per
    byte, low nibble first, [..., K / 2] (``torch.float4_e2m1fn_x2`` for torch inputs). ``scales``: one code per
    block [..., K / block] (``float8_e8m0fnu`` / ``float8_e4m3fn`` tensors, or uint8 arrays), or, when
    ``swizzled``, the flat 32_4_4 buffer of the scales viewed as [rows, K / block] (:mod:`mmaemu.scale_layout`).
    ``global_scale``: NVFP4's fp32 per-tensor scale (None for MX and single-level NVFP4).
    """

    codes: object
    scales: object
    fmt: str
    scale_fmt: str
    block_size: int
    global_scale: Optional[float]
    swizzled: bool
    shape: tuple


# ----------------------------------------------------------------------------------------------------------------
# Rounding onto an element grid


def _positive_grid(fmt):
    """(values, codes) of the format's finite non-negative codes in increasing order (codes increase with value)."""
    table = formats.values(fmt)
    size = 1 << (formats.CODE_BITS[fmt] - 1)
    codes = np.arange(size)
    codes = codes[np.isfinite(table[:size])]
    # round_to_format's compiled rounding reads code i as the grid's i-th value (the finite codes come first)
    assert (codes == np.arange(codes.size)).all(), fmt
    return np.ascontiguousarray(table[codes], np.float64), codes


_GRIDS = {fmt: _positive_grid(fmt) for fmt in MX_FORMATS}


def round_to_format(y, fmt):
    """uint8 codes of fp32 values ``y`` rounded to nearest, ties to the even code, saturating at ±max (±Inf too).

    A value rounding to zero keeps its sign bit; NaN gives 0x7F in FP8 and code 0 in FP6/FP4 (no NaN there).
    FP4 codes are one per element (pack them with :func:`mmaemu.formats.pack_fp4`). Compiled
    (:func:`mmaemu.arith.rounding.grid_code`: the first grid value not below |y|, then the nearer of it and its
    lower neighbour).
    """
    from .cpu.block_scaled import round_onto_grid

    bits = formats.CODE_BITS[fmt]
    return round_onto_grid(np.asarray(y, np.float32), _GRIDS[fmt][0], formats.MANT_BITS[fmt], formats.EMIN[fmt],
                           1 << (bits - 1), 0x7F if bits == 8 else 0)


# ----------------------------------------------------------------------------------------------------------------
# Inputs and outputs


def _input_blocks(x, block, name):
    """(fp32 blocks [..., K / block, block], original shape, torch device or None) of a torch tensor or array."""
    device = None
    if type(x).__module__.startswith("torch"):
        import torch

        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise BlockQuantizeError(f"{name}: x must be float32, bfloat16 or float16, got {x.dtype}")
        device = x.device
        values = x.detach().to("cpu", torch.float32).numpy()
    else:
        values = np.asarray(x)
        if values.dtype not in (np.float32, np.float16):
            raise BlockQuantizeError(f"{name}: numpy x must be float32 or float16, got {values.dtype}")
        values = values.astype(np.float32)
    if values.ndim < 1 or values.shape[-1] % block:
        raise BlockQuantizeError(f"{name}: the last axis of x (shape {values.shape}) must be a multiple of the "
                                 f"block size {block}; pad K first")
    from .plan.flush import check_no_flush_to_zero

    check_no_flush_to_zero()
    return values.reshape(values.shape[:-1] + (-1, block)), values.shape, device


def _output(codes, scales, fmt, scale_fmt, block, global_scale, shape, device, swizzle):
    """Pack FP4, swizzle the scales on request, and return torch tensors on ``device`` for torch inputs."""
    if fmt == "e2m1":
        codes = formats.pack_fp4(codes)
    if swizzle:
        rows = int(np.prod(scales.shape[:-1])) if scales.ndim > 1 else 1
        scales = scale_layout.to_blocked(scales.reshape(rows, scales.shape[-1]))
    if device is not None:
        import torch

        code_dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
                      "e2m1": getattr(torch, "float4_e2m1fn_x2", torch.uint8)}.get(fmt, torch.uint8)
        scale_dtype = torch.float8_e8m0fnu if scale_fmt == "ue8m0" else torch.float8_e4m3fn
        codes = torch.from_numpy(np.ascontiguousarray(codes)).view(code_dtype).to(device)
        scales = torch.from_numpy(np.ascontiguousarray(scales)).view(scale_dtype).to(device)
    return BlockQuantized(codes, scales, fmt, scale_fmt, block, global_scale, bool(swizzle), tuple(shape))


# ----------------------------------------------------------------------------------------------------------------
# MX


def _scale_exponent(amax, fmt, mode):
    """Unclamped E of the module rule from the fp32 bits of amax (NaN handled by the caller)."""
    bits = amax.astype(np.float32).view(np.uint32).astype(np.int64)
    if mode == "even":
        # Round the significand to MANT_BITS[fmt] fraction bits, ties away from zero; a carry bumps the exponent.
        bits = (bits + (1 << (_FP32_MANT_BITS - formats.MANT_BITS[fmt] - 1))) & ~((1 << _FP32_MANT_BITS) - 1)
    exponent = ((bits >> _FP32_MANT_BITS) & 0xFF) - E8M0_BIAS
    if mode == "ceil":
        exponent = exponent + ((bits & ((1 << _FP32_MANT_BITS) - 1)) != 0)
    return exponent


def mx_scale_codes(amax, fmt="e4m3", scaling_mode="floor"):
    """UE8M0 scale codes (uint8) of fp32 block amaxes (module rule)."""
    _check_mx(fmt, scaling_mode)
    amax = np.asarray(amax, np.float32)
    unbiased = np.clip(_scale_exponent(amax, fmt, scaling_mode) - EMAX_ELEM[fmt], -E8M0_BIAS, E8M0_BIAS)
    return np.where(np.isnan(amax), E8M0_NAN, unbiased + E8M0_BIAS).astype(np.uint8)


def _check_mx(fmt, scaling_mode):
    if fmt not in MX_FORMATS:
        raise BlockQuantizeError(f"quantize_mx: element format {fmt!r} is not an MX format; expected one of "
                                 f"{MX_FORMATS}")
    if scaling_mode == "rceil":
        raise BlockQuantizeError(
            "quantize_mx: scaling_mode='rceil' is not modelled (torchao 0.18.0 derives it with a floating log2 "
            "whose rounding near powers of two depends on the device, and later torchao versions changed the "
            "rule); use 'floor' (the OCP MX specification's rule), 'ceil' or 'even'")
    if scaling_mode not in SCALING_MODES:
        raise BlockQuantizeError(f"quantize_mx: unknown scaling_mode {scaling_mode!r}; expected one of "
                                 f"{SCALING_MODES}")


def quantize_mx(x, fmt="e4m3", *, scaling_mode="floor", block_size=MX_BLOCK, swizzle=False) -> BlockQuantized:
    """MX quantisation of ``x`` [..., K] along its last axis (module rule; torchao 0.18.0 ``to_mx``).

    ``fmt``: the element format ("e4m3", "e5m2" for MXFP8, "e2m3", "e3m2" for MXFP6, "e2m1" for MXFP4).
    ``swizzle=True`` returns the scales in the 32_4_4 layout of the scales viewed as [prod(leading dims),
    K / 32], as ``_scaled_mm`` takes them on sm_100. Only blocks of 32 (the OCP and sm_100 block) are modelled.
    """
    _check_mx(fmt, scaling_mode)
    if block_size != MX_BLOCK:
        raise BlockQuantizeError(f"quantize_mx: block_size={block_size!r} is not modelled; MX uses blocks of "
                                 f"{MX_BLOCK}")
    blocks, shape, device = _input_blocks(x, MX_BLOCK, "quantize_mx")
    codes, scale_codes = _mx_codes(blocks, fmt, scaling_mode)
    return _output(codes.reshape(shape), scale_codes, fmt, "ue8m0", MX_BLOCK, None, shape, device, swizzle)


def _mx_codes(blocks, fmt, scaling_mode):
    """(element codes [..., K / 32, 32], one uint8 per element, and scale codes [..., K / 32]) of fp32 blocks."""
    from .cpu.block_scaled import mx_blocks

    rows = blocks.reshape(-1, blocks.shape[-2] * blocks.shape[-1])
    scale_codes, scaled = mx_blocks(rows, blocks.shape[-1], EMAX_ELEM[fmt], SCALING_MODES.index(scaling_mode),
                                    formats.MANT_BITS[fmt])
    return round_to_format(scaled, fmt).reshape(blocks.shape), scale_codes.reshape(blocks.shape[:-1])


# ----------------------------------------------------------------------------------------------------------------
# NVFP4


def nvfp4_global_scale(x) -> float:
    """torchao's dynamic NVFP4 global scale of a tensor (``per_tensor_amax_to_scale``) as the GPU computes it:
    ``fp32(max|x| * fp32(1 / 2688))`` (CUDA's division by a Python number); NaN when x holds a NaN."""
    blocks, _, _ = _input_blocks(x, 1, "nvfp4_global_scale")
    return _global_scale_of(blocks)


def _global_scale_of(values) -> float:
    """:func:`nvfp4_global_scale` of the fp32 values of a tensor (any shape)."""
    from .cpu.block_scaled import abs_max

    return float(divide_by_number(abs_max(values), NVFP4_GLOBAL_DIVISOR))


def quantize_nvfp4(x, *, global_scale="dynamic", swizzle=False) -> BlockQuantized:
    """NVFP4 quantisation of ``x`` [..., K] along its last axis (module rule; torchao 0.18.0 ``nvfp4_quantize``).

    ``global_scale``: "dynamic" (torchao's ``per_tensor_amax_to_scale`` of x, :func:`nvfp4_global_scale`), a
    number (an fp32 value, e.g. a calibrated one), or None (single-level scaling). ``swizzle`` as in
    :func:`quantize_mx`.
    """
    blocks, shape, device = _input_blocks(x, NVFP4_BLOCK, "quantize_nvfp4")
    codes, scale_codes, global_scale = _nvfp4_codes(blocks, global_scale)
    return _output(codes.reshape(shape), scale_codes, "e2m1", "ue4m3", NVFP4_BLOCK, global_scale, shape, device,
                   swizzle)


def _nvfp4_codes(blocks, global_scale):
    """(element codes [..., K / 16, 16], one uint8 per element, scale codes [..., K / 16], the global scale as
    :class:`BlockQuantized` holds it) of fp32 blocks, ``global_scale`` as :func:`quantize_nvfp4` takes it."""
    if isinstance(global_scale, str):
        if global_scale != "dynamic":
            raise BlockQuantizeError(f"quantize_nvfp4: global_scale must be 'dynamic', a number or None, got "
                                     f"{global_scale!r}")
        global_scale = _global_scale_of(blocks)  # x's values, read and checked once
    elif global_scale is not None:
        global_scale = float(np.float32(float(global_scale)))
        if not (math.isfinite(global_scale) and global_scale > 0):
            raise BlockQuantizeError(f"quantize_nvfp4: a given global_scale must be positive and finite in fp32, "
                                     f"got {global_scale!r}; use 'dynamic' or None")
    from .cpu.block_scaled import nvfp4_block_values, nvfp4_element_values

    rows = blocks.reshape(-1, blocks.shape[-2] * blocks.shape[-1])
    g = None if global_scale is None else np.float32(global_scale)
    # b = torchao's max_abs / 6.0 on CUDA (a multiplication by fp32(1 / 6)), b / g, clamped unless NaN, rounded
    scale_codes = round_to_format(nvfp4_block_values(rows, NVFP4_BLOCK, reciprocal_of_number(FP4_MAX), g,
                                                     UE4M3_MIN, UE4M3_MAX), "e4m3")
    # x * fp32(1 / s), or x * fp32(fp32(1 / g) / s), clamped to [-6, 6] unless NaN, rounded
    scaled = nvfp4_element_values(rows, NVFP4_BLOCK, scale_codes, _UE4M3_VALUES,
                                  None if g is None else reciprocal_of_number(g), FP4_MAX)
    return (round_to_format(scaled, "e2m1").reshape(blocks.shape), scale_codes.reshape(blocks.shape[:-1]),
            global_scale)


class CastRows(NamedTuple):
    """A cast of rows [M, K] for a block-scaled GEMM (:func:`cast_rows`): ``quantized``, the
    :class:`BlockQuantized` with swizzled scales (torch tensors for a torch input), and what the kernel reads of
    it: ``codes`` [M, K] (uint8, one per element, FP4 unpacked) and ``scales`` [M, K / block] (uint8, plain
    layout)."""

    quantized: BlockQuantized
    codes: np.ndarray
    scales: np.ndarray


def cast_rows(x, recipe: str, fmt: str = "e4m3") -> CastRows:
    """The cast of a recipe layer's input rows ``x`` [M, K]: ``recipe`` "mx" (:func:`quantize_mx` with element
    format ``fmt``, the "floor" rule) or "nvfp4" (:func:`quantize_nvfp4`, dynamic global scale), with swizzled
    scales, and the plain codes and scales the kernel reads (:class:`CastRows`): the same bits as those
    functions, the kernel's operands without unswizzling the scales again."""
    if recipe == "mx":
        blocks, shape, device = _input_blocks(x, MX_BLOCK, "quantize_mx")
        codes, scale_codes = _mx_codes(blocks, fmt, "floor")
        scale_fmt, block, global_scale = "ue8m0", MX_BLOCK, None
    else:
        fmt = "e2m1"
        blocks, shape, device = _input_blocks(x, NVFP4_BLOCK, "quantize_nvfp4")
        codes, scale_codes, global_scale = _nvfp4_codes(blocks, "dynamic")
        scale_fmt, block = "ue4m3", NVFP4_BLOCK
    codes = codes.reshape(shape)
    q = _output(codes, scale_codes, fmt, scale_fmt, block, global_scale, shape, device, True)
    return CastRows(q, codes, scale_codes.reshape(shape[0], -1))


#: float32 value of each UE4M3 scale code (NaN for the NaN code).
_UE4M3_VALUES = formats.decode_scales(np.arange(256, dtype=np.uint8), "ue4m3").astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# Dequantisation (exact, for inspection and tests)


def dequantize_blocks(q: BlockQuantized) -> np.ndarray:
    """float64 values [..., K] of a :class:`BlockQuantized`: element * block scale (* global scale), exact except
    where the product leaves float64's range; NaN scales give NaN blocks."""
    codes, scales = _as_uint8(q.codes), _as_uint8(q.scales)
    if q.fmt == "e2m1":
        codes = formats.unpack_fp4(codes)
    shape = q.shape
    blocks_per_row = shape[-1] // q.block_size
    if q.swizzled:
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        scales = scale_layout.from_blocked(scales, rows, blocks_per_row)
    scales = scales.reshape(shape[:-1] + (blocks_per_row, 1))
    values = formats.decode(codes.reshape(shape[:-1] + (blocks_per_row, q.block_size)), q.fmt)
    result = values * formats.decode_scales(scales, q.scale_fmt)
    if q.global_scale is not None:
        result = result * q.global_scale
    return result.reshape(shape)


def _as_uint8(array):
    if type(array).__module__.startswith("torch"):
        import torch

        return array.detach().cpu().contiguous().view(torch.uint8).numpy()
    return np.asarray(array, np.uint8)

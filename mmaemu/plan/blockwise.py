"""Validation of torch's block-wise FP8 calls (1x128 / 128x128 fp32 scales, cuBLASLt >= 12.9 on sm_90), as torch
2.13's sources state the rules (pytorch/pytorch at commit 0174dfabc023f11a8f78c79c301b49c8d7e02c8b, the stored
version read: ``aten/src/ATen/native/cuda/ScaledBlas.cpp`` and the stored ``aten/src/ATen/cuda/CUDABlas.cpp``).

Two entry points take the scales in two layouts; both describe the same memory, which cuBLASLt reads:

* ``torch._scaled_mm`` (v1, ``mmaemu.scaled_mm``; :func:`v1_blockwise_pair`, torch's ``get_joint_scaling``): scale_a
  is [M, ceil(K/128)] with strides (1, M) (1x128, "outer-dim-major") or [ceil(M/128), ceil(K/128)] row-major
  (128x128); scale_b is given for mat2 [K, N]: [ceil(K/128), N] row-major (1x128) or [ceil(K/128), ceil(N/128)]
  with strides (1, ceil(K/128)) (128x128). A stride of a dimension of size 1 is free. The pairs are tried after
  tensor-wise and row-wise, in torch's order 128x128 x 1x128, 1x128 x 128x128, 1x128 x 1x128.
* ``F.scaled_mm`` / ``torch._scaled_mm_v2`` (v2, :func:`mmaemu.blockwise_cublaslt.scaled_mm_blockwise`;
  :func:`check_v2_scales`, torch's ``_scaled_block*``): a 1x128 scale is [rows, ceil(K/128)] with strides (1, rows)
  (scale_b: rows = N); a 128x128 scale is [L4, ceil(rows/128)] with strides (1, L4), L4 = round_up(ceil(K/128), 4):
  cuBLASLt's BLK128x128 layout pads each row of blocks to a multiple of 4 scales (16 bytes; Transformer Engine's
  ``CuBLASScaleMunger`` pads the same way). The v2 check also needs both operands ``float8_e4m3fn``
  (``check_deepseek_recipe``); v1 takes any float8 pair but E5M2 x E5M2.

v1 states 128x128 strides without that padding: where a scale has more than one row of blocks and
ceil(K/128) is not a multiple of 4 the two layouts differ, and which scales cuBLASLt then reads is not fixed by
the source: refused (:func:`check_blockwise_call`).

After torch's common checks (f.2) and the zero-size return (f.3), :func:`check_blockwise_call` applies, in order:
the platform (the profile must be :data:`mmaemu.platform.blockwise.PROFILE`: torch's ``_check_deepseek_support``),
the sm_90 layout rule of ``_scaled_gemm`` (input row-major, mat2 column-major), the modelled formats, cuBLAS's
``get_scale_mode`` (no ``use_fast_accum`` with block scales; it reads the scale mode of cuBLAS's A, torch's mat2,
first), then mmaemu's scope (bf16 or fp32 output, M a multiple of 4 for 1x128 scales on mat_a, the 128x128 v1
layout above, a row-major out, no grad).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from ..errors import ReferenceRejectsError, UnsupportedFeatureError
from ..platform.blockwise import PROFILE, is_blockwise_profile
from .descriptors import dtype_name
from .layout import is_row_major, mat2_is_column_major

__all__ = ["BLOCK_1X128", "BLOCK_128X128", "BlockwiseSpec", "v1_blockwise_pair", "blockwise_hint",
           "check_blockwise_call", "check_v2_scales", "pair_name", "block_of"]

BLOCK_1X128 = (1, 128)
BLOCK_128X128 = (128, 128)
_PAIRS = ((BLOCK_128X128, BLOCK_1X128), (BLOCK_1X128, BLOCK_128X128), (BLOCK_1X128, BLOCK_1X128))  # torch's order
_OUT_DTYPES = ("bfloat16", "float32")  # Transformer Engine's zero-tolerance tests cover these two
_MODELLED = ("float8_e4m3fn", "float8_e5m2")
_TORCH = "[torch _scaled_mm, cuBLASLt >= 12.9]"
_SCOPE = "[mmaemu scope]"


class BlockwiseSpec(NamedTuple):
    """A checked block-wise call: the scale blocks of mat_a and mat_b ((1, 128) or (128, 128)), the element
    formats and the entry point whose scale layout the call used ("v1" or "v2")."""

    block_a: tuple
    block_b: tuple
    fmt_a: str
    fmt_b: str
    api: str


def _ceil_div(x: int, y: int) -> int:
    return -(-x // y)


def pair_name(block_a, block_b) -> str:
    """"1x128 x 128x128" and the like."""
    return " x ".join(f"{rows}x{cols}" for rows, cols in (block_a, block_b))


_BLOCKS_BY_NAME = {"BlockWise1x128": BLOCK_1X128, "BlockWise128x128": BLOCK_128X128}


def block_of(value, name: str) -> tuple:
    """(1, 128) or (128, 128) from a tuple or a ``torch.nn.functional.ScalingType`` (BlockWise1x128 / 128x128)."""
    found = _BLOCKS_BY_NAME.get(getattr(value, "name", None))
    if found is None and isinstance(value, (tuple, list)) and tuple(value) in (BLOCK_1X128, BLOCK_128X128):
        found = tuple(value)
    if found is None:
        raise ValueError(f"{name} must be (1, 128), (128, 128), ScalingType.BlockWise1x128 or "
                         f"ScalingType.BlockWise128x128, got {value!r}")
    return found


# ------------------------------------------------------------------------------------------------------------
# v1: torch._scaled_mm's get_joint_scaling


def _size_stride(scale, dim: int, size: int, stride: int) -> bool:
    """torch's ``check_size_stride``: the size matches, and the stride too unless the size is at most 1."""
    return scale.shape[dim] == size and (size <= 1 or scale.stride(dim) == stride)


def _is_v1_block(scale, rows: int, K: int, block, transposed: bool) -> bool:
    """torch's ``is_blockwise_1x128_scaling`` / ``is_blockwise_128x128_scaling`` of an operand [rows, K] and its
    scale (``transposed``: scale_b, given for mat2 [K, N], is checked as scale_b.t())."""
    if dtype_name(scale.dtype) != "float32" or scale.dim() != 2:
        return False
    shape, strides = tuple(scale.shape), tuple(scale.stride())
    if transposed:
        shape, strides = shape[::-1], strides[::-1]
    view = _Shaped(shape, strides)
    chunks = _ceil_div(K, 128)
    if block == BLOCK_1X128:
        return _size_stride(view, 0, rows, 1) and _size_stride(view, 1, chunks, rows)
    return _size_stride(view, 0, _ceil_div(rows, 128), chunks) and _size_stride(view, 1, chunks, 1)


class _Shaped(NamedTuple):
    shape: tuple
    strides: tuple

    def stride(self, dim):
        return self.strides[dim]


def v1_blockwise_pair(input, mat2, scale_a, scale_b) -> Optional[tuple]:
    """The block-wise pair ((block of A, block of B)) torch 2.13's ``_scaled_mm`` finds for these scales, or None
    (tensor-wise and row-wise come first in its order, and any other scales are not block-wise)."""
    M, K = input.shape
    N = mat2.shape[1]
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return None
    if (scale_a.dim() == 2 and scale_b.dim() == 2 and tuple(scale_a.shape) == (M, 1)
            and tuple(scale_b.shape) == (1, N)):
        return None  # row-wise shapes (torch tries RowWise before the block-wise pairs)
    for block_a, block_b in _PAIRS:
        if _is_v1_block(scale_a, M, K, block_a, False) and _is_v1_block(scale_b, N, K, block_b, True):
            return block_a, block_b
    return None


def blockwise_hint(input, mat2, scale_a, scale_b) -> str:
    """The way out appended to torch 2.7.1's "Invalid scaling configuration" where the scales are torch 2.13's
    block-wise scales: which profile computes them."""
    if v1_blockwise_pair(input, mat2, scale_a, scale_b) is None:
        return ""
    return (f"; these are 1x128 / 128x128 block-wise scales, which torch sends to cuBLASLt >= 12.9 (torch 2.7.1 "
            f"with cuBLASLt 12.8 has no block-wise scaling): profile {PROFILE!r} computes them")


# ------------------------------------------------------------------------------------------------------------
# v2: F.scaled_mm / torch._scaled_mm_v2's _scaled_block* checks


def _torch_rejects(message: str) -> ReferenceRejectsError:
    return ReferenceRejectsError(f"{message} {_TORCH}")


def _check_v2_scale(scale, name: str, rows: int, K: int, block) -> None:
    """torch 2.13's shape and stride rule of one v2 block-wise scale (module docstring)."""
    chunks = _ceil_div(K, 128)
    if block == BLOCK_1X128:
        shape, lead = (rows, chunks), rows
    else:
        lead = _ceil_div(chunks, 4) * 4
        shape = (lead, _ceil_div(rows, 128))
    if dtype_name(scale.dtype) != "float32" or scale.dim() != 2 or tuple(scale.shape) != shape:
        raise _torch_rejects(f"{name} must have shape {shape[0]} x {shape[1]} Float elements, got "
                             f"{tuple(scale.shape)} {dtype_name(scale.dtype)}")
    if scale.stride(0) != 1 or not (scale.stride(1) == lead or (shape[1] == 1 and scale.stride(1) == 1)):
        raise _torch_rejects(f"{name} must have strides (1, {lead}); got {tuple(scale.stride())}: pass "
                             f"s.t().contiguous().t() of the [{shape[1]}, {shape[0]}] row-major scales")


def check_v2_scales(mat_a, mat_b, scale_a, scale_b, block_a, block_b) -> None:
    """torch 2.13's recipe acceptance (``check_deepseek_recipe``: both operands float8_e4m3fn, fp32 scales, one of
    each) and the scale shapes and strides of ``_scaled_block*`` for a v2 call (module docstring)."""
    if (block_a, block_b) not in _PAIRS:
        raise _torch_rejects(f"Invalid scaling configuration: block-wise {pair_name(block_a, block_b)} is not one "
                             "of cuBLASLt's pairs (1x128 x 1x128, 1x128 x 128x128, 128x128 x 1x128)")
    for name, t in (("mat_a", mat_a), ("mat_b", mat_b)):
        if dtype_name(t.dtype) != "float8_e4m3fn":
            raise _torch_rejects(f"Invalid scaling configuration: block-wise scaling through F.scaled_mm takes "
                                 f"float8_e4m3fn operands only, {name} is {t.dtype} (torch's check_deepseek_recipe; "
                                 f"torch._scaled_mm / mmaemu.scaled_mm take E5M2 with one E4M3 operand)")
    M, K = mat_a.shape
    N = mat_b.shape[1]
    _check_v2_scale(scale_a, "scale_a", M, K, block_a)
    _check_v2_scale(scale_b, "scale_b", N, K, block_b)


# ------------------------------------------------------------------------------------------------------------
# After torch's common checks and the zero-size return


def check_blockwise_call(input, mat2, block_a, block_b, od, bias, out, use_fast_accum, profile, api: str,
                         grad: dict) -> BlockwiseSpec:
    """The rules of a block-wise call with M, N, K > 0 after torch's common checks, in the order of the module
    docstring; returns the :class:`BlockwiseSpec`."""
    if not is_blockwise_profile(profile):
        raise _torch_rejects(f"DeepSeek style (1x128, 128x128) scaling requires cublasLt >= 12.9 and sm_90: profile "
                             f"{profile.name!r} is not that platform; use profile={PROFILE!r}")
    if not is_row_major(input) or not mat2_is_column_major(mat2):
        raise _torch_rejects("Only multiplication of row-major and column-major matrices is supported by cuBLASLt: "
                             "pass a row-major [M, K] input and a column-major [K, N] mat2 (w.t() of a row-major "
                             "[N, K] w)")
    for name, t in (("input", input), ("mat2", mat2)):
        if dtype_name(t.dtype) not in _MODELLED:
            raise _torch_rejects(f"{name} dtype {t.dtype} has no FP8 GEMM on sm_90; use torch.float8_e4m3fn or "
                                 "torch.float8_e5m2")
    if use_fast_accum:
        first = "1x128" if block_b == BLOCK_1X128 else "128x128"
        raise _torch_rejects(f"scaled_gemm doesn't support fast accum with {first} blockwise scaling; pass "
                             "use_fast_accum=False")
    _check_scope(input, block_a, od, bias, out, grad)
    if api == "v1":
        M, K = input.shape
        for name, block, rows in (("scale_a", block_a, M), ("scale_b", block_b, mat2.shape[1])):
            if block == BLOCK_128X128:
                _check_v1_block_layout(rows, K, name)
    return BlockwiseSpec(block_a, block_b, _format(input), _format(mat2), api)


def _format(t) -> str:
    return "e4m3" if dtype_name(t.dtype) == "float8_e4m3fn" else "e5m2"


def _scope(message: str) -> UnsupportedFeatureError:
    return UnsupportedFeatureError(f"{message} {_SCOPE}")


def _check_scope(input, block_a, od, bias, out, grad) -> None:
    """What the evidence (Transformer Engine's zero-tolerance tests) does not cover: refused, never guessed."""
    if dtype_name(od) not in _OUT_DTYPES:
        raise _scope(f"block-wise output dtype {od}: Transformer Engine's zero-tolerance tests of cuBLASLt cover "
                     "bfloat16 and float32 outputs only; pass out_dtype=torch.bfloat16 or torch.float32")
    if bias is not None and dtype_name(bias.dtype) != "bfloat16":
        raise _scope(f"a {bias.dtype} bias: only a bfloat16 bias is covered by the zero-tolerance tests")
    M, K = input.shape
    if block_a == BLOCK_1X128 and M % 4:
        raise _scope(f"M = {M} with 1x128 scales on the input: Transformer Engine's tests find cuBLASLt refusing "
                     "M = 255 with 1x128 input scales (accepted with 128x128) and cover multiples of 16 only; pad M "
                     "to a multiple of 4")
    if out is not None and not is_row_major(out):
        raise _scope("out= must be row-major for a block-wise call (the model writes the row-major result)")
    needing = [name for name, t in grad.items() if t is not None and getattr(t, "requires_grad", False)]
    if needing and _grad_enabled():
        raise _scope(f"{', '.join(needing)} require(s) grad while grad mode is enabled: mmaemu is inference only; "
                     "wrap the call in torch.no_grad()")


def _check_v1_block_layout(rows: int, K: int, name: str) -> None:
    """A v1 128x128 scale with more than one row of blocks must have a multiple of 4 blocks along K (module
    docstring): refused otherwise."""
    chunks = _ceil_div(K, 128)
    if _ceil_div(rows, 128) > 1 and chunks % 4:
        raise _scope(f"{name}: 128x128 scales with {chunks} blocks along K (not a multiple of 4) through "
                     "torch._scaled_mm: torch states them unpadded while cuBLASLt's BLK128x128 layout pads each row "
                     "of blocks to a multiple of 4, so which scales the GPU reads is not fixed by the source; use "
                     "mmaemu.blockwise_cublaslt.scaled_mm_blockwise (F.scaled_mm's padded layout), or K a multiple "
                     "of 512")


def _grad_enabled() -> bool:
    import torch

    return torch.is_grad_enabled()

"""DeepGEMM's casting helpers (``deep_gemm.utils.math`` of v2.1.1.post3, commit
c9f8b34dcdacc20aa746b786f983492c51072870), with the same names and arguments, computing the bits those helpers
compute on the GPU (DeepGEMM runs them on CUDA tensors), whatever device the input is on.

``per_token_cast_to_fp8``: one scale per 1 x 128 strip of each row (activations, recipe (1, 128, 128)'s A);
``per_block_cast_to_fp8``: one scale per 128 x 128 block (weights, B); ``per_channel_cast_to_fp8``: one scale per
128 x 1 strip of each column. Zero-padded to whole strips and blocks; a tensor with no rows gives empty codes and
scales.

Each step and the device kernel it follows (docs/semantics.md, section 13, has the table):

* ``amax = max |x|`` per strip in fp32: exact on every device (a maximum, NaN propagating);
* ``amax.clamp(1e-4)``: NaN passes, the bound is fp32(1e-4), on CPU and CUDA alike;
* ``sf = amax / 448.0`` — **the CUDA kernel's result**: a tensor divided by a Python number is
  ``amax * fp32(1 / 448)`` on CUDA (:func:`mmaemu.base.gpu_torch_ops.divide_by_number`), while torch's CPU kernel
  divides (correctly rounded) and differs for about half the scales;
* with ``use_ue8m0=True``, ``sf = 2 ** ceil(log2 sf)`` (:func:`ceil_to_ue8m0`): the exact power of two, refused
  where the GPU's log2 rounding would decide it (never for bf16 or fp16 inputs);
* ``x * (1.0 / sf)``: ``1.0 / sf`` is ``sf.reciprocal() * 1.0`` (``Tensor.__rtruediv__``), a correctly rounded
  fp32 reciprocal on CPU and CUDA, then one fp32 multiplication;
* ``.to(torch.float8_e4m3fn)``: torch's round-to-nearest-even cast (the c10 conversion both devices use; it
  saturates in torch 2.13.0 and gives NaN beyond 480 in older versions, but the products stay below
  448 * (1 + 2**-21) and round to at most 448 in either).
"""

from __future__ import annotations

from typing import Tuple

import torch

from ..base.gpu_torch_ops import divide_by_number, power_of_two_ceil

__all__ = ["ceil_div", "align", "ceil_to_ue8m0", "per_token_cast_to_fp8", "per_channel_cast_to_fp8",
           "per_block_cast_to_fp8", "get_mk_alignment_for_contiguous_layout"]

_E4M3_MAX = 448.0
_AMAX_FLOOR = 1e-4
_BLOCK = 128


def ceil_div(x: int, y: int) -> int:
    """``ceil(x / y)`` for positive y."""
    return -(-x // y)


def align(x: int, y: int) -> int:
    """x rounded up to a multiple of y."""
    return ceil_div(x, y) * y


def get_mk_alignment_for_contiguous_layout() -> int:
    """Rows of each group of an M-grouped contiguous GEMM start at a multiple of this (128)."""
    return _BLOCK


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """``2 ** ceil(log2(|x|))`` of fp32 scales: each rounded up to a power of two (a UE8M0 scale), as the GPU
    computes DeepGEMM's ``torch.pow(2.0, torch.ceil(torch.log2(x.abs())))``.

    The exact power of two (0 stays 0); a value whose log2 lies within 2 fp32 ulps above an integer, where CUDA's
    1-ulp ``log2f`` may round either way, raises :class:`~mmaemu.errors.UnsupportedFeatureError`
    (:func:`mmaemu.base.gpu_torch_ops.power_of_two_ceil`). As DeepGEMM, refuses scales without a positive maximum;
    an empty tensor gives an empty result.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"ceil_to_ue8m0: the scales must be float32 (DeepGEMM's casts make fp32 scales), got "
                        f"{x.dtype}")
    if x.numel() == 0:
        return x.detach().clone()
    if not x.reshape(-1).amax().item() > 0:
        raise ValueError("ceil_to_ue8m0: the scales must have a positive maximum")
    powers = power_of_two_ceil(x.detach().cpu().numpy(), rule="ceil_to_ue8m0",
                               way_out="cast bf16 or fp16 values, whose scales never fall there (for a layer: "
                                       "model.to(torch.bfloat16)), or use use_ue8m0=False")
    return torch.from_numpy(powers).to(x.device)


def _scale_of(amax: torch.Tensor, use_ue8m0: bool) -> torch.Tensor:
    """DeepGEMM's ``amax.clamp(1e-4) / 448.0`` as CUDA computes it (a multiplication by fp32(1/448))."""
    sf = divide_by_number(amax.clamp(_AMAX_FLOOR), _E4M3_MAX)
    return ceil_to_ue8m0(sf) if use_ue8m0 else sf


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(codes [m, n] float8_e4m3fn, scales [m, ceil(n / 128)] fp32) of a 2-D x, one scale per 1 x 128 strip
    (m may be 0: an expert without tokens)."""
    if x.dim() != 2:
        raise ValueError(f"per_token_cast_to_fp8 takes a 2-D tensor, got {x.dim()} dimensions")
    m, n = x.shape
    strips_per_row = ceil_div(n, _BLOCK)
    padded = torch.zeros((m, strips_per_row * _BLOCK), dtype=x.dtype, device=x.device)
    padded[:, :n] = x
    strips = padded.view(m, strips_per_row, _BLOCK)  # explicit sizes: a tensor without rows has no -1 to infer
    sf = _scale_of(strips.abs().float().amax(dim=2).view(m, strips_per_row), use_ue8m0)
    codes = (strips * (1.0 / sf.unsqueeze(2))).to(torch.float8_e4m3fn)
    return codes.view_as(padded)[:, :n].contiguous(), sf


def per_channel_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(codes [m, n], scales [m / 128, n]) of a 2-D x whose m is a multiple of 128, one scale per 128 x 1 strip."""
    if x.dim() != 2 or x.size(0) % _BLOCK:
        raise ValueError(f"per_channel_cast_to_fp8 takes a 2-D tensor with a multiple of 128 rows, got shape "
                         f"{tuple(x.shape)}")
    m, n = x.shape
    strips = x.view(-1, _BLOCK, n)
    sf = _scale_of(strips.abs().float().amax(dim=1).view(-1, n), use_ue8m0)
    return (strips * (1.0 / sf.unsqueeze(1))).to(torch.float8_e4m3fn).view(m, n), sf


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(codes [m, n], scales [ceil(m / 128), ceil(n / 128)]) of a 2-D x, one scale per 128 x 128 block."""
    if x.dim() != 2:
        raise ValueError(f"per_block_cast_to_fp8 takes a 2-D tensor, got {x.dim()} dimensions")
    m, n = x.shape
    padded = torch.zeros((align(m, _BLOCK), align(n, _BLOCK)), dtype=x.dtype, device=x.device)
    padded[:m, :n] = x
    blocks = padded.view(-1, _BLOCK, padded.size(1) // _BLOCK, _BLOCK)
    sf = _scale_of(blocks.abs().float().amax(dim=(1, 3), keepdim=True), use_ue8m0)
    codes = (blocks * (1.0 / sf)).to(torch.float8_e4m3fn)
    return codes.view_as(padded)[:m, :n].contiguous(), sf.view(blocks.size(0), blocks.size(2))

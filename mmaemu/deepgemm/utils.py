"""DeepGEMM's casting helpers (``deep_gemm.utils.math`` of v2.1.1.post3), with the same names, arguments and
rounding: every step is the same torch operation on the same dtypes, so the codes and scales are the ones DeepGEMM's
helpers produce (torch's CPU and CUDA kernels of these elementwise operations are correctly rounded IEEE
operations: amax, a division by 448, a reciprocal, a multiply, a round-to-nearest cast to float8_e4m3fn).

``per_token_cast_to_fp8``: one scale per 1 x 128 strip of each row (activations, recipe (1, 128, 128)'s A);
``per_block_cast_to_fp8``: one scale per 128 x 128 block (weights, B); ``per_channel_cast_to_fp8``: one scale per
128 x 1 strip of each column. Scales are ``amax / 448`` with amax clamped to at least 1e-4, or that rounded up to
a power of two with ``use_ue8m0=True``.
"""

from __future__ import annotations

from typing import Tuple

import torch

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
    """``2 ** ceil(log2(|x|))``: x rounded up to a power of two (a UE8M0 scale)."""
    if not x.reshape(-1).amax().item() > 0:
        raise ValueError("ceil_to_ue8m0: the scales must have a positive maximum")
    return torch.pow(2.0, torch.ceil(torch.log2(x.abs())))


def _scale_of(amax: torch.Tensor, use_ue8m0: bool) -> torch.Tensor:
    sf = amax.clamp(_AMAX_FLOOR) / _E4M3_MAX
    return ceil_to_ue8m0(sf) if use_ue8m0 else sf


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(codes [m, n] float8_e4m3fn, scales [m, ceil(n / 128)] fp32) of a 2-D x, one scale per 1 x 128 strip."""
    if x.dim() != 2:
        raise ValueError(f"per_token_cast_to_fp8 takes a 2-D tensor, got {x.dim()} dimensions")
    m, n = x.shape
    padded = torch.zeros((m, align(n, _BLOCK)), dtype=x.dtype, device=x.device)
    padded[:, :n] = x
    strips = padded.view(m, -1, _BLOCK)
    sf = _scale_of(strips.abs().float().amax(dim=2).view(m, -1), use_ue8m0)
    codes = (strips * (1.0 / sf.unsqueeze(2))).to(torch.float8_e4m3fn)
    return codes.view(m, -1)[:, :n].contiguous(), sf


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

"""The swizzled block-scale layout of Blackwell block-scaled GEMMs (cuBLAS "32_4_4", torch's ``SWIZZLE_32_4_4``).

On sm_100, ``torch._scaled_mm`` hands MXFP8 (UE8M0 scales, one per 32 elements of K) and NVFP4 (UE4M3 scales, one
per 16) operands to cuBLASLt, which reads each operand's scale matrix ``S`` [rows, cols] (rows = M or N,
cols = K / block) in a tiled order, not row-major:

* ``S`` is padded with zero codes to ``(128 * ceil(rows / 128), 4 * ceil(cols / 4))``;
* the padded matrix is cut into tiles of 128 rows by 4 columns, stored one after the other, 512 codes each,
  tile row-major (tile ``(tr, tc)`` is tile number ``tr * tiles_per_row + tc``);
* inside a tile, the scale at row ``outer`` (0..127) and column ``inner`` (0..3) lies at byte
  ``(outer % 32) * 16 + (outer // 32) * 4 + inner``: the tile is read as four 32x4 sub-tiles that are
  interleaved row by row.

So scale ``S[r, c]`` lies at offset ``512 * ((r // 128) * ceil(cols / 4) + c // 4) + (r % 128 % 32) * 16 +
(r % 128 // 32) * 4 + c % 4`` of the flat swizzled buffer. Sources: the cuBLAS documentation, section "1D block
scaling factors layout" (the offset formula, quoted by torch's test helper ``from_blocked`` in
``torch/testing/_internal/common_quantized.py`` of pytorch/pytorch at commit
0174dfabc023f11a8f78c79c301b49c8d7e02c8b, which also holds ``to_blocked``), and ``to_blocked`` / ``from_blocked``
in ``torchao/prototype/mx_formats/utils.py`` of pytorch/ao at commit 047c25c4bd98ad45cafd8e637bf1ffc9fdc0c432
(same padding, same permutation, flat output). Both pad with zeros: code 0 is 0.0 for UE4M3 and 2**-127 for UE8M0,
and padded scales belong to no element of the operand.

:func:`to_blocked` and :func:`from_blocked` take numpy uint8 codes or torch tensors (uint8, ``float8_e8m0fnu``,
``float8_e4m3fn``; computed on the tensor's device and returned in its dtype). Importing this module does not
import torch.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .formats import dtype_name

__all__ = ["TILE_ROWS", "TILE_COLS", "BlockedShape", "blocked_shape", "blocked_offsets", "to_blocked",
           "from_blocked"]

#: Rows and columns of one scale tile (512 codes).
TILE_ROWS, TILE_COLS = 128, 4
_SUBTILE_ROWS = 32
_TORCH_SCALE_DTYPES = ("uint8", "float8_e8m0fnu", "float8_e4m3fn")


class BlockedShape(NamedTuple):
    """The padded scale matrix of a [rows, cols] scale matrix: its rows, columns and the flat length."""

    padded_rows: int
    padded_cols: int
    numel: int


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def blocked_shape(rows: int, cols: int) -> BlockedShape:
    """The padded shape and flat length of the swizzled layout of a [rows, cols] scale matrix."""
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"scale_layout: {name} must be a non-negative integer, got {value!r}")
    padded_rows, padded_cols = _ceil_to(int(rows), TILE_ROWS), _ceil_to(int(cols), TILE_COLS)
    return BlockedShape(padded_rows, padded_cols, padded_rows * padded_cols)


def blocked_offsets(rows: int, cols: int) -> np.ndarray:
    """int64 array [rows, cols]: the offset in the flat swizzled buffer of each scale ``S[r, c]`` (module rule)."""
    return _kept_offsets(rows, cols).copy()


def _kept_offsets(rows: int, cols: int) -> np.ndarray:
    """:func:`blocked_offsets`, computed once per shape and kept (read-only; at most _KEPT_SHAPES shapes), so that
    a layer's repeated calls do not compute them again."""
    shape = blocked_shape(rows, cols)
    key = (int(rows), int(cols))
    offsets = _KEPT_OFFSETS.get(key)
    if offsets is None:
        r = np.arange(rows, dtype=np.int64)[:, None]
        c = np.arange(cols, dtype=np.int64)[None, :]
        tile = (r // TILE_ROWS) * (shape.padded_cols // TILE_COLS) + c // TILE_COLS
        outer, inner = r % TILE_ROWS, c % TILE_COLS
        within = ((outer % _SUBTILE_ROWS) * (TILE_COLS * TILE_ROWS // _SUBTILE_ROWS) +
                  (outer // _SUBTILE_ROWS) * TILE_COLS)
        offsets = tile * (TILE_ROWS * TILE_COLS) + within + inner
        offsets.flags.writeable = False
        if len(_KEPT_OFFSETS) >= _KEPT_SHAPES:
            _KEPT_OFFSETS.clear()
        _KEPT_OFFSETS[key] = offsets
    return offsets


_KEPT_SHAPES = 64
_KEPT_OFFSETS = {}


def _is_torch_tensor(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "view") and hasattr(x, "dtype")


def _torch_codes(x, name):
    """A torch scale tensor viewed as uint8 codes (its dtype must be one of the scale dtypes)."""
    import torch

    dtype = dtype_name(x.dtype)
    if dtype not in _TORCH_SCALE_DTYPES:
        raise TypeError(f"{name}: torch scales must be uint8, float8_e8m0fnu or float8_e4m3fn, got {x.dtype}")
    return x.detach().contiguous().view(torch.uint8)


def _numpy_codes(x, name):
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise TypeError(f"{name}: numpy scales must be uint8 codes, got dtype {x.dtype}")
    return x


def to_blocked(scales):
    """The flat swizzled buffer (length ``blocked_shape(rows, cols).numel``) of a 2-D scale matrix [rows, cols].

    numpy uint8 codes give a numpy uint8 array; a torch tensor gives a 1-D tensor of its dtype on its device, as
    torch's and torchao's ``to_blocked`` return it for ``_scaled_mm``. Padding positions hold code 0.
    """
    if getattr(scales, "ndim", None) != 2:
        raise ValueError(f"to_blocked: a 2-D scale matrix [rows, cols] is required, got shape "
                         f"{tuple(getattr(scales, 'shape', ()))}")
    rows, cols = (int(n) for n in scales.shape)
    shape = blocked_shape(rows, cols)
    offsets = _kept_offsets(rows, cols).reshape(-1)
    if _is_torch_tensor(scales):
        import torch

        codes = _torch_codes(scales, "to_blocked")
        out = torch.zeros(shape.numel, dtype=torch.uint8, device=codes.device)
        out[torch.from_numpy(offsets.copy()).to(codes.device)] = codes.reshape(-1)
        return out.view(scales.dtype)
    codes = _numpy_codes(scales, "to_blocked")
    out = np.zeros(shape.numel, np.uint8)
    out[offsets] = codes.reshape(-1)
    return out


def from_blocked(swizzled, rows: int, cols: int):
    """The scale matrix [rows, cols] held by a swizzled buffer (any shape with ``blocked_shape(rows,
    cols).numel`` elements, read flat): the inverse of :func:`to_blocked`, padding dropped.

    numpy in, numpy uint8 out; a torch tensor gives a tensor of its dtype on its device. A buffer of the wrong
    length raises ValueError (it belongs to another operand shape or block size).
    """
    shape = blocked_shape(rows, cols)
    size = int(np.prod(swizzled.shape)) if hasattr(swizzled, "shape") else len(swizzled)
    if size != shape.numel:
        raise ValueError(f"from_blocked: a swizzled scale buffer of a [{rows}, {cols}] scale matrix has "
                         f"{shape.numel} codes ({shape.padded_rows} x {shape.padded_cols} padded), got {size}")
    offsets = _kept_offsets(rows, cols)
    if _is_torch_tensor(swizzled):
        import torch

        codes = _torch_codes(swizzled, "from_blocked").reshape(-1)
        index = torch.from_numpy(offsets.copy()).to(codes.device)
        return codes[index].view(swizzled.dtype)
    return _numpy_codes(swizzled, "from_blocked").reshape(-1)[offsets]

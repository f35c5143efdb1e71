"""The swizzled 32_4_4 block-scale layout (mmaemu.scale_layout) against a scalar swizzle written from the cuBLAS
documentation's offset formula ("1D block scaling factors layout")."""

import numpy as np
import pytest
import torch

from mmaemu import scale_layout

SHAPES = [(1, 1), (1, 4), (3, 5), (127, 3), (128, 4), (129, 4), (128, 5), (200, 7), (256, 8), (257, 13),
          (64, 128), (0, 4), (5, 0)]


def documented_swizzle(scales):
    """The swizzled buffer, one scale at a time: tiles of 128 x 4 scales, 512 bytes each, numbered row-major over
    the padded matrix; inside a tile, row ``outer`` and column ``inner`` go to byte
    ``(outer % 32) * 16 + (outer // 32) * 4 + inner``; everything else is zero padding."""
    rows, cols = scales.shape
    tiles_down, tiles_across = -(-rows // 128), -(-cols // 4)
    out = [0] * (tiles_down * tiles_across * 512)
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * tiles_across + c // 4
            outer, inner = r % 128, c % 4
            out[512 * tile + (outer % 32) * 16 + (outer // 32) * 4 + inner] = int(scales[r, c])
    return np.array(out, np.uint8)


def random_scales(rows, cols, seed):
    # Codes 1..255 so that a lost scale (code 0) is told apart from padding.
    return np.random.default_rng(seed).integers(1, 256, (rows, cols), dtype=np.uint8)


@pytest.mark.parametrize("rows, cols", SHAPES)
def test_forward_matches_documented_formula(rows, cols):
    scales = random_scales(rows, cols, rows * 1000 + cols)
    np.testing.assert_array_equal(scale_layout.to_blocked(scales), documented_swizzle(scales))


@pytest.mark.parametrize("rows, cols", SHAPES)
def test_inverse_recovers_every_scale(rows, cols):
    scales = random_scales(rows, cols, rows * 7 + cols)
    swizzled = scale_layout.to_blocked(scales)
    np.testing.assert_array_equal(scale_layout.from_blocked(swizzled, rows, cols), scales)
    # A swizzled buffer in the 2-D shape torchao's tile view gives reads the same.
    if swizzled.size:
        np.testing.assert_array_equal(scale_layout.from_blocked(swizzled.reshape(-1, 16), rows, cols), scales)


def test_inverse_is_a_bijection_on_the_padded_buffer():
    # Every position of a padded buffer belongs to exactly one scale of the padded matrix.
    rows, cols = 256, 8
    offsets = scale_layout.blocked_offsets(rows, cols)
    assert sorted(offsets.reshape(-1).tolist()) == list(range(rows * cols))


@pytest.mark.parametrize("rows, cols", [(3, 5), (130, 2), (200, 7)])
def test_padding_is_zero(rows, cols):
    scales = random_scales(rows, cols, 5)
    swizzled = scale_layout.to_blocked(scales)
    shape = scale_layout.blocked_shape(rows, cols)
    assert swizzled.size == shape.numel == shape.padded_rows * shape.padded_cols
    taken = np.zeros(shape.numel, bool)
    taken[scale_layout.blocked_offsets(rows, cols).reshape(-1)] = True
    assert np.all(swizzled[~taken] == 0) and np.all(swizzled[taken] != 0)
    assert taken.sum() == rows * cols


def test_one_tile_interleaves_four_row_groups():
    # Row r of one 128 x 4 tile holding code r: byte 16 * i + 4 * j + c holds row 32 * j + i.
    scales = np.repeat(np.arange(128, dtype=np.uint8)[:, None], 4, axis=1)
    tile = scale_layout.to_blocked(scales).reshape(32, 4, 4)
    expected = (np.arange(32)[:, None, None] + 32 * np.arange(4)[None, :, None]) + np.zeros((1, 1, 4), int)
    np.testing.assert_array_equal(tile, expected)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float8_e8m0fnu, torch.float8_e4m3fn])
def test_torch_tensors_keep_their_dtype(dtype):
    codes = random_scales(130, 6, 11)
    if dtype == torch.float8_e4m3fn:
        codes &= 0x7E  # finite, non-negative UE4M3 codes
    tensor = torch.from_numpy(codes).view(dtype)
    swizzled = scale_layout.to_blocked(tensor)
    assert swizzled.dtype == dtype and swizzled.dim() == 1
    np.testing.assert_array_equal(swizzled.view(torch.uint8).numpy(), documented_swizzle(codes))
    back = scale_layout.from_blocked(swizzled, 130, 6)
    assert back.dtype == dtype
    np.testing.assert_array_equal(back.view(torch.uint8).numpy(), codes)


def test_refusals():
    with pytest.raises(ValueError, match="2-D"):
        scale_layout.to_blocked(np.zeros(4, np.uint8))
    with pytest.raises(TypeError, match="uint8"):
        scale_layout.to_blocked(np.zeros((2, 2), np.float32))
    with pytest.raises(TypeError, match="float8_e8m0fnu"):
        scale_layout.to_blocked(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="1024 codes"):
        scale_layout.from_blocked(np.zeros(100, np.uint8), 3, 5)
    with pytest.raises(ValueError, match="non-negative"):
        scale_layout.blocked_shape(-1, 4)

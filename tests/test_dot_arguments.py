"""mmaemu.model.dot (semantics.md f.9, b.1): the refusals it shares with scaled_mm/accumulate, and what a block
without products does to the accumulator (b.1 steps 2-6 and "Model-only details"), against the oracle."""

import numpy as np
import pytest
import torch

import mmaemu
import oracle
from mmaemu.errors import MmaemuError
from mmaemu.model.presets import get_preset

ZERO_BLOCK = torch.zeros(32, dtype=torch.float8_e4m3fn)  # one hopper block, two ada blocks, no products


def f32_bits(x) -> int:
    return int(np.array(x, dtype=np.float32).view(np.uint32))


def c_of(bits: int) -> torch.Tensor:
    return torch.from_numpy(np.array(bits, dtype=np.uint32).view(np.float32))


def bits_of(t: torch.Tensor) -> int:
    return int(t.numpy().view(np.uint32))


def test_dot_refuses_flush_to_zero_mode_like_scaled_mm():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        with pytest.raises(MmaemuError, match=r"set_flush_denormal\(False\)"):
            mmaemu.model.dot(ZERO_BLOCK, ZERO_BLOCK, c_of(0x00000400))
    finally:
        torch.set_flush_denormal(False)


def test_dot_needs_a_k_axis():
    scalar = torch.tensor(1.0).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"at least one dimension \[\.\.\., K\].*0-D"):
        mmaemu.model.dot(scalar, scalar)
    with pytest.raises(ValueError, match="0-D"):
        mmaemu.model.dot(torch.tensor(1.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64), fmt="e4m3")


def test_dot_refuses_meta_and_sparse_tensors():
    with pytest.raises(TypeError, match="meta"):
        mmaemu.model.dot(ZERO_BLOCK.to("meta"), ZERO_BLOCK.to("meta"))
    sparse = torch.zeros(2, 32, dtype=torch.float64).to_sparse()
    with pytest.raises(TypeError, match="sparse"):
        mmaemu.model.dot(sparse, sparse, fmt="e4m3")


# c = bits of the accumulator, expected = the block result, as semantics.md b.1 gives it
ZERO_BLOCK_CASES = [
    (f32_bits(2.0**-140), 0x00000000),  # spec: "c = 2^-140 with no products gives +0"
    (f32_bits(2.0**-139), 0x00000400),  # spec: "c = 2^-139 survives as 0x00000400"
    (f32_bits(-(2.0**-140)), 0x00000000),  # truncated to nothing: +0 (step 5), not -0
    (0x00000003, 0x00000000),  # a subnormal accumulator below the 2^-139 grid
    (0x00001C00, 0x00001C00),  # a subnormal on the 2^-139 grid survives
    (0x00001E00, 0x00001C00),  # ... its bits below the grid are cut
    (f32_bits(1 + 2.0**-20), f32_bits(1.0)),  # spec: more than 14 significant bits are truncated
    (0x80000000, 0x00000000),  # -0 with no products: +0 (step 2)
    (f32_bits(3 * 2.0**-25), f32_bits(3 * 2.0**-25)),  # GEMM accumulators (14 bits, >= 2^-25): unchanged
    (f32_bits(-(2.0**10 + 1)), f32_bits(-(2.0**10 + 1))),
]


@pytest.mark.parametrize("preset", ["hopper", "ada"])
@pytest.mark.parametrize("c_bits,expected", ZERO_BLOCK_CASES, ids=[f"{c:08x}" for c, _ in ZERO_BLOCK_CASES])
def test_a_block_without_products_truncates_the_accumulator_like_any_block(preset, c_bits, expected):
    got = mmaemu.model.dot(ZERO_BLOCK, ZERO_BLOCK, c_of(c_bits), preset=preset)
    assert bits_of(got) == expected
    assert oracle.dot([0] * 32, [0] * 32, "e4m3", "e4m3", c_bits, get_preset(preset)) == expected
    # K = 0 is no block at all: c comes back unchanged (the oracle reads it the same way)
    empty = torch.zeros(0, dtype=torch.float8_e4m3fn)
    assert bits_of(mmaemu.model.dot(empty, empty, c_of(c_bits))) == c_bits
    assert oracle.dot([], [], "e4m3", "e4m3", c_bits, get_preset(preset)) == c_bits

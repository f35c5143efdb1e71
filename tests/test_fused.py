"""The compiled call of kept tensor-wise plans (mmaemu.cpu.fused) gives the bits of accumulate_codes then
epilogue_codes: NaN/Inf codes, every output dtype, B decoded or prepared, a kept B whose codes changed."""

import numpy as np
import pytest

from mmaemu.cpu import epilogue_codes, accumulate_codes
from mmaemu.cpu.fused import TensorwiseGemm
from mmaemu.cpu.prepared import PreparedStore
from mmaemu.model.presets import ADA, HOPPER


def codes(rng, shape, specials):
    c = rng.integers(0, 256, shape, dtype=np.uint8)
    if not specials:
        c[(c & 0x7F) == 0x7F] = 0
    return c


class Identity:
    """Stands for B's tensor in the store: identity and version."""

    def __init__(self, codes):
        self.codes = codes
        self._version = 0
        self.shape = codes.shape

    def data_ptr(self):
        return self.codes.ctypes.data

    def storage_offset(self):
        return 0

    def stride(self):
        return self.codes.strides

    dtype = "e4m3"
    device = "cpu"

    def is_inference(self):
        return False


@pytest.mark.parametrize("shape", [(1, 64, 64), (3, 200, 96), (9, 300, 130)])
@pytest.mark.parametrize("preset,fast,out_name", [(HOPPER, True, "bfloat16"), (ADA, False, "float32"),
                                                   (HOPPER, True, "float8_e4m3fn")])
@pytest.mark.parametrize("specials", [False, True])
def test_fused_call_gives_the_two_step_bits(shape, preset, fast, out_name, specials):
    rng = np.random.default_rng(sum(shape))
    M, N, K = shape
    a, b = codes(rng, (M, K), specials), codes(rng, (N, K), specials)
    bits = (0x3F000000, 0x40400000, 0x3E800000)
    want = epilogue_codes(accumulate_codes(a, b, "e4m3", "e4m3", preset, fast, cpu_engine="tile"), bits[0], bits[1],
                          bits[2] if out_name.startswith("float8") else None, out_name)
    gemm = TensorwiseGemm("tile", preset, "e4m3", "e4m3", M, N, K, fast, 1, "none", out_name)
    scales = np.array([bits[0], bits[1], bits[2], out_name.startswith("float8")], np.int64)
    assert np.array_equal(gemm.run(a, b, scales), want)
    store, tensor = PreparedStore(), Identity(b)
    for _ in range(3):  # seen, prepared, kept
        assert np.array_equal(gemm.run(a, b, scales, store, tensor), want)
    assert store.prepares == 1
    b[0, 0] ^= 1  # changed behind the version counter: the kept B is not used
    want = epilogue_codes(accumulate_codes(a, b, "e4m3", "e4m3", preset, fast, cpu_engine="tile"), bits[0], bits[1],
                          bits[2] if out_name.startswith("float8") else None, out_name)
    assert np.array_equal(gemm.run(a, b, scales, store, tensor), want)


@pytest.mark.parametrize("specials", [False, True])
def test_fused_call_on_the_offset_engine(specials):
    from mmaemu.cpu.features import numba_target, offset_engine_decline

    if offset_engine_decline(numba_target()) is not None:
        pytest.skip("the offset engine cannot run on this CPU target")
    rng = np.random.default_rng(7)
    M, N, K = 32, 400, 96
    a, b = codes(rng, (M, K), specials), codes(rng, (N, K), specials)
    want = epilogue_codes(accumulate_codes(a, b, "e4m3", "e4m3", HOPPER, True, cpu_engine="tile"), 0x3F800000,
                          0x3F000000, None, "bfloat16")
    gemm = TensorwiseGemm("offset", HOPPER, "e4m3", "e4m3", M, N, K, True, 1, "none", "bfloat16")
    scales = np.array([0x3F800000, 0x3F000000, 0, 0], np.int64)
    store, tensor = PreparedStore(), Identity(b)
    for _ in range(3):
        assert np.array_equal(gemm.run(a, b, scales, store, tensor), want)

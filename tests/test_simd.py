"""Every 512-bit vector intrinsic of mmaemu.cpu.simd equals its exact twin, lane by lane, on random and edge inputs
(+-0, subnormals, the smallest and largest normal exponents, sign bits, carries, every shift amount in use), as the
CUDA primitives equal theirs (tests/test_offset.py), the FMA inside a toward-zero region; on an AVX2 target (MXCSR
rounding) the region is what makes it round toward zero, and MXCSR is back as it was after a region, also when the
kernel raises inside one. Runs only where the offset engine runs (AVX-512 F/BW/DQ/VL, or AVX2 and FMA)."""

import numpy as np
import pytest
from numba import njit

from mmaemu.arith.fp32 import fma_toward_zero_exact
from mmaemu.cpu import features, simd

pytestmark = pytest.mark.skipif(features.offset_engine_decline(features.numba_target()) is not None,
                                reason="the target CPU has neither AVX-512 F/BW/DQ/VL nor AVX2 and FMA")
MXCSR = features.offset_rounding(features.numba_target()) == features.ROUNDING_MXCSR

EDGE_WORDS = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x007FFFFF, 0x00800000, 0x3F800000,
              0x7F7FFFFF, 0x7FFFFFFF, 0x80000000, 0x80000001, 0xFF7FFFFF, 0xFFFF0000, 0xFFFFFFFF, 0x01010101,
              0x80808080, 0x7F7F7F7F, 0x0300030F, 0x061E0500]


def word_rows(seed, rows=64):
    """[rows, 16] uint32: edge words in every pairing, then random words, random bytes and random halves."""
    rng = np.random.default_rng(seed)
    edges = np.array(EDGE_WORDS, np.uint32)
    parts = [np.resize(np.roll(edges, s), 16 * 4) for s in range(0, len(edges), 3)]
    parts.append(rng.integers(0, 2**32, 16 * rows, dtype=np.uint64).astype(np.uint32))
    parts.append((rng.integers(0, 2**16, 16 * rows, dtype=np.uint64) * 0x10001).astype(np.uint32))
    flat = np.concatenate(parts)
    return flat[: len(flat) // 16 * 16].reshape(-1, 16)


def _binary_kernel(op):
    @njit
    def run(x, y, out):
        for r in range(x.shape[0]):
            v = op(simd.load_u32(x, r, 0), simd.load_u32(y, r, 0))
            simd.store_f32(out, r, 0, simd.f32_of_bits(v))
    return run


BINARY = [(simd.add_i32, simd.add_i32_twin), (simd.sub_i32, simd.sub_i32_twin), (simd.mul_i32, simd.mul_i32_twin),
          (simd.and_i32, simd.and_i32_twin), (simd.or_i32, simd.or_i32_twin), (simd.xor_i32, simd.xor_i32_twin),
          (simd.andnot_i32, simd.andnot_i32_twin), (simd.max_i32, simd.max_i32_twin),
          (simd.min_i32, simd.min_i32_twin), (simd.max_u16x2_i32, simd.max_u16x2_twin)]


@pytest.mark.parametrize("op,twin", BINARY, ids=lambda f: getattr(f, "__name__", str(f)))
def test_integer_operations_equal_their_twins(op, twin):
    x, y = word_rows(1), word_rows(2)
    y = np.concatenate([y[1:], y[:1]])
    out = np.zeros(x.shape, np.float32)
    _binary_kernel(op)(x, y, out)
    got = out.view(np.uint32)
    want = np.stack([twin(x[r], y[r]) for r in range(x.shape[0])])
    assert np.array_equal(got, want)


@njit
def _shifts(x, out):
    for r in range(x.shape[0]):
        v = simd.load_u32(x, r, 0)
        simd.store_f32(out, 4 * r, 0, simd.f32_of_bits(simd.shl_i32(v, 23)))
        simd.store_f32(out, 4 * r + 1, 0, simd.f32_of_bits(simd.lshr_i32(v, 23)))
        simd.store_f32(out, 4 * r + 2, 0, simd.f32_of_bits(simd.lshr_i32(v, 7)))
        simd.store_f32(out, 4 * r + 3, 0, simd.f32_of_bits(simd.rotate16_i32(v, 16)))


def test_shifts_and_the_half_swap_equal_their_twins():
    x = word_rows(3)
    out = np.zeros((4 * x.shape[0], 16), np.float32)
    _shifts(x, out)
    got = out.view(np.uint32).reshape(x.shape[0], 4, 16)
    for r in range(x.shape[0]):
        assert np.array_equal(got[r, 0], simd.shl_i32_twin(x[r], 23))
        assert np.array_equal(got[r, 1], simd.lshr_i32_twin(x[r], 23))
        assert np.array_equal(got[r, 2], simd.lshr_i32_twin(x[r], 7))
        assert np.array_equal(got[r, 3], simd.rotate16_i32_twin(x[r]))


@njit
def _broadcasts(values, words, out):
    for r in range(values.shape[0]):
        simd.store_f32(out, 2 * r, 0, simd.broadcast_f32(values[r]))
        simd.store_f32(out, 2 * r + 1, 0, simd.f32_of_bits(simd.broadcast_i32(words[r])))


def test_broadcasts_and_bit_casts():
    words = np.array(EDGE_WORDS, np.uint32)
    values = words.view(np.float32)
    out = np.zeros((2 * len(words), 16), np.float32)
    _broadcasts(values, words, out)
    bits = out.view(np.uint32)
    assert np.array_equal(bits[0::2], np.repeat(words[:, None], 16, axis=1))
    assert np.array_equal(bits[1::2], np.repeat(words[:, None], 16, axis=1))


@njit
def _byte_results(x, y, out):
    """All 64 bytes of max_i8 and add_saturated_i8, through the four quarters."""
    for r in range(x.shape[0]):
        a, b = simd.bytes_of_i32(simd.load_u32(x, r, 0)), simd.load_i8(y, r, 0)
        m, s = simd.max_i8(a, b), simd.add_saturated_i8(a, b)
        simd.store_f32(out, 8 * r + 0, 0, simd.f32_of_bits(simd.widen_i8(m, 0)))
        simd.store_f32(out, 8 * r + 1, 0, simd.f32_of_bits(simd.widen_i8(m, 1)))
        simd.store_f32(out, 8 * r + 2, 0, simd.f32_of_bits(simd.widen_i8(m, 2)))
        simd.store_f32(out, 8 * r + 3, 0, simd.f32_of_bits(simd.widen_i8(m, 3)))
        simd.store_f32(out, 8 * r + 4, 0, simd.f32_of_bits(simd.widen_i8(s, 0)))
        simd.store_f32(out, 8 * r + 5, 0, simd.f32_of_bits(simd.widen_i8(s, 1)))
        simd.store_f32(out, 8 * r + 6, 0, simd.f32_of_bits(simd.widen_i8(s, 2)))
        simd.store_f32(out, 8 * r + 7, 0, simd.f32_of_bits(simd.widen_i8(s, 3)))


def test_byte_operations_equal_their_twins():
    """max_i8, add_saturated_i8 (saturation both ways: the byte exponent pass's absent sums), widen_i8 and
    load_i8 / bytes_of_i32 on every byte of edge and random rows."""
    x = word_rows(4)[:, :16].copy()
    y = np.concatenate([word_rows(5)[1:], word_rows(5)[:1]])[:, :16].copy().view(np.int8)  # [rows, 64] bytes
    xb = x.view(np.int8)
    out = np.zeros((8 * x.shape[0], 16), np.float32)
    _byte_results(x, y, out)
    got = out.view(np.uint32).reshape(x.shape[0], 2, 64)
    for r in range(x.shape[0]):
        assert np.array_equal(got[r, 0], simd.max_i8_twin(xb[r], y[r]).astype(np.int32).view(np.uint32))
        assert np.array_equal(got[r, 1], simd.add_saturated_i8_twin(xb[r], y[r]).astype(np.int32).view(np.uint32))
        for q in range(4):
            assert np.array_equal(got[r, 0, 16 * q:16 * (q + 1)], simd.widen_i8_twin(simd.max_i8_twin(xb[r], y[r]), q))
    assert (simd.add_saturated_i8_twin(np.int8(100), np.int8(100)) == 127
            and simd.add_saturated_i8_twin(np.int8(-100), np.int8(-100)) == -128)


@njit
def _broadcast_loads(values, words, out):
    for r in range(values.shape[0]):
        for c in range(values.shape[1]):
            simd.store_f32(out, 2 * (r * values.shape[1] + c), 0, simd.broadcast_load_f32(values, r, c))
            simd.store_f32(out, 2 * (r * values.shape[1] + c) + 1, 0,
                           simd.f32_of_bits(simd.broadcast_load_i32(words, r, c)))


def test_broadcast_loads():
    words = np.array(EDGE_WORDS[:24], np.uint32).reshape(4, 6)
    out = np.zeros((2 * words.size, 16), np.float32)
    _broadcast_loads(words.view(np.float32), words, out)
    bits = out.view(np.uint32)
    assert np.array_equal(bits[0::2], np.repeat(words.reshape(-1, 1), 16, axis=1))
    assert np.array_equal(bits[1::2], np.repeat(words.reshape(-1, 1), 16, axis=1))


def float_rows(seed, rows=400):
    """[rows, 16] float32 triples' operands: +-0, subnormals, the normal extremes, values one ulp apart, and random
    values of every exponent; NaN and Inf left out (the twins' domain)."""
    rng = np.random.default_rng(seed)
    edges = np.array([0.0, -0.0, 1.0, -1.0, 1.5, 2.0**-149, -2.0**-149, 2.0**-126, 2.0**-127, 3 * 2.0**-140,
                      2.0**60, -2.0**60, 2.0**-60, 1 + 2.0**-23, 1 - 2.0**-24, 3.0, 0.1, -0.7], np.float32)
    words = rng.integers(0, 2**32, 16 * rows, dtype=np.uint64).astype(np.uint32)
    words &= np.uint32(0xBFFFFFFF)  # exponents below 2**1: products and sums stay finite
    flat = np.concatenate([np.resize(edges, 16 * 8), words.view(np.float32)])
    return flat[: len(flat) // 16 * 16].reshape(-1, 16)


@njit
def _floats(a, b, c, out):
    for r in range(a.shape[0]):
        # the operands are loaded inside the region (the rule of mmaemu.cpu.simd: loaded before it, the FMA was
        # computed before MXCSR changed and rounded to nearest)
        saved = simd.enter_toward_zero()
        x, y, z = simd.load_f32(a, r, 0), simd.load_f32(b, r, 0), simd.load_f32(c, r, 0)
        simd.store_f32(out, 4 * r, 0, simd.fma_toward_zero_f32(x, y, z))
        simd.leave_toward_zero(saved)
        simd.store_f32(out, 4 * r + 1, 0, simd.add_f32(x, z))
        simd.store_f32(out, 4 * r + 2, 0, simd.sub_f32(x, z))
        simd.store_f32(out, 4 * r + 3, 0, simd.max_f32(x, z))


def test_float_operations_equal_their_twins():
    """The embedded-rounding FMA against the exact emulation (round toward zero, +0 for x + (-x), subnormal
    results), RNE add/sub and the maximum against NumPy; c = -a*b rows give exact cancellations."""
    a, b, c = float_rows(4), float_rows(5), float_rows(6)
    rng = np.random.default_rng(7)
    cancel = rng.random(a.shape) < 0.1
    c[cancel] = -(a[cancel].astype(np.float64) * b[cancel]).astype(np.float32)
    out = np.zeros((4 * a.shape[0], 16), np.float32)
    _floats(a, b, c, out)
    got = out.view(np.uint32).reshape(a.shape[0], 4, 16)
    fma = np.array([[fma_toward_zero_exact(x, y, z) for x, y, z in zip(*row)] for row in zip(a, b, c)], np.float32)
    assert np.array_equal(got[:, 0], fma.view(np.uint32))
    assert np.array_equal(got[:, 0], np.stack([simd.fma_toward_zero_twin(*row) for row in zip(a[:8], b[:8], c[:8])]
                                              + list(fma[8:])).view(np.uint32))
    assert np.array_equal(got[:, 1], (a + c).view(np.uint32))
    assert np.array_equal(got[:, 2], (a - c).view(np.uint32))
    assert np.array_equal(got[:, 3], np.where(a > c, a, c).view(np.uint32))


@njit
def _fma_outside_a_region(a, b, c, out):
    for r in range(a.shape[0]):
        simd.store_f32(out, r, 0, simd.fma_toward_zero_f32(simd.load_f32(a, r, 0), simd.load_f32(b, r, 0),
                                                           simd.load_f32(c, r, 0)))


def test_the_region_is_what_rounds_toward_zero_on_avx2():
    """With MXCSR rounding the FMA outside a region rounds to nearest (other bits than the twin's on many lanes);
    with embedded rounding it rounds toward zero anywhere. MXCSR is the same before and after the regions."""
    a, b, c = float_rows(4), float_rows(5), float_rows(6)
    before = simd.thread_mxcsr()
    inside = np.zeros((4 * a.shape[0], 16), np.float32)
    _floats(a, b, c, inside)
    outside = np.zeros(a.shape, np.float32)
    _fma_outside_a_region(a, b, c, outside)
    assert simd.thread_mxcsr() & simd.MXCSR_ROUNDING_FIELD == before & simd.MXCSR_ROUNDING_FIELD == 0
    differ = (outside.view(np.uint32) != inside.view(np.uint32).reshape(a.shape[0], 4, 16)[:, 0]).sum()
    assert (differ > a.size // 10) if MXCSR else differ == 0


@njit
def _enter_and_raise(fail):
    simd.enter_toward_zero()
    if fail:
        raise ValueError("inside the region")
    return 1


@pytest.mark.skipif(not MXCSR, reason="MXCSR is changed only where the FMA rounds by it (AVX2 without AVX-512)")
def test_mxcsr_is_restored_when_a_kernel_raises():
    """A kernel that raises inside its region leaves the thread in round-toward-zero; call_restoring_mxcsr puts the
    thread's MXCSR back (and the kernels' own leave_toward_zero does when they return)."""
    before = simd.thread_mxcsr()
    assert before & simd.MXCSR_ROUNDING_FIELD == 0
    try:
        with pytest.raises(ValueError, match="inside the region"):
            simd.call_restoring_mxcsr(_enter_and_raise, True)
        assert simd.thread_mxcsr() == before
        with pytest.raises(ValueError, match="inside the region"):
            _enter_and_raise(True)
        assert simd.thread_mxcsr() & simd.MXCSR_ROUNDING_FIELD == simd.MXCSR_TOWARD_ZERO  # what the guard undoes
    finally:
        simd.set_thread_mxcsr(np.uint32(before))
    assert simd.thread_mxcsr() == before


# ----------------------------------------------------------------------------------------------------------------
# The operations of B's panel decode (mmaemu.cpu.offset_kernel.decode_words): byte lanes, shifts, conversions

BYTE_BINARY = [(simd.add_i8, simd.add_i8_twin), (simd.sub_i8, simd.sub_i8_twin), (simd.and_i8, simd.and_i8_twin),
               (simd.or_i8, simd.or_i8_twin), (simd.xor_i8, simd.xor_i8_twin), (simd.max_u8, simd.max_u8_twin),
               (simd.less_u8, simd.less_u8_twin)]


def _byte_binary_kernel(op):
    @njit
    def run(x, y, out):
        for r in range(x.shape[0]):
            v = op(simd.bytes_of_i32(simd.load_u32(x, r, 0)), simd.bytes_of_i32(simd.load_u32(y, r, 0)))
            simd.store_u32(out, r, 0, simd.i32_of_bytes(v))
    return run


def _byte_operands():
    """[rows, 16] words of every pair of bytes that matters: edges (0, 1, 0x7F, 0x80, 0xFF, ...) and random."""
    x, y = word_rows(8), word_rows(9)
    return x, np.concatenate([y[1:], y[:1]])


@pytest.mark.parametrize("op,twin", BYTE_BINARY, ids=lambda f: getattr(f, "__name__", str(f)))
def test_byte_operations_of_the_decode_equal_their_twins(op, twin):
    x, y = _byte_operands()
    out = np.zeros(x.shape, np.uint32)
    _byte_binary_kernel(op)(x, y, out)
    want = np.stack([twin(x[r].view(np.int8), y[r].view(np.int8)) for r in range(x.shape[0])])
    assert np.array_equal(out.view(np.int8), want)


@njit
def _decode_operations(x, y, mask, out, low_bytes):
    for r in range(x.shape[0]):
        a, b = simd.load_u32(x, r, 0), simd.load_u32(y, r, 0)
        ab, bb = simd.bytes_of_i32(a), simd.bytes_of_i32(b)
        simd.store_u32(out, 8 * r, 0, simd.i32_of_bytes(simd.select_i8(simd.bytes_of_i32(simd.load_u32(mask, r, 0)),
                                                                       ab, bb)))
        simd.store_u32(out, 8 * r + 1, 0, simd.i32_of_bytes(simd.trailing_zeros_i8(ab)))
        simd.store_u32(out, 8 * r + 2, 0, simd.lshr_by_i32(a, simd.and_i32(b, simd.broadcast_i32(31))))
        simd.store_u32(out, 8 * r + 3, 0, simd.ashr_i32(a, 24))
        simd.store_u32(out, 8 * r + 4, 0, simd.ashr_i32(a, 7))
        simd.store_f32(out.view(np.float32), 8 * r + 5, 0, simd.f32_of_i32(a))
        simd.store_f32(out.view(np.float32), 8 * r + 6, 0,
                       simd.mul_f32(simd.f32_of_i32(simd.ashr_i32(a, 24)), simd.f32_of_bits(simd.and_i32(
                           b, simd.broadcast_i32(0x3F800000)))))
        simd.store_low_bytes(low_bytes, r, 0, a)


def test_decode_operations_equal_their_twins():
    """select_i8 on masks of 0xFF and 0 bytes, trailing_zeros_i8 (8 for a zero byte), shifts by lane counts and
    arithmetic shifts, the int32 conversion (exact below 2**24 and rounded above), a product of small integers
    and powers of two (the decode's values: exact), and the low bytes stored."""
    x, y = _byte_operands()
    rng = np.random.default_rng(10)
    mask = np.where(rng.random((x.shape[0], 64)) < 0.5, 0xFF, 0).astype(np.uint8).view(np.uint32)
    out = np.zeros((8 * x.shape[0], 16), np.uint32)
    low_bytes = np.zeros((x.shape[0], 16), np.int8)
    _decode_operations(x, y, mask, out, low_bytes)
    got = out.reshape(x.shape[0], 8, 16)
    for r in range(x.shape[0]):
        xb, yb = x[r].view(np.int8), y[r].view(np.int8)
        assert np.array_equal(got[r, 0].view(np.int8), simd.select_i8_twin(mask[r].view(np.int8), xb, yb))
        assert np.array_equal(got[r, 1].view(np.int8), simd.trailing_zeros_i8_twin(xb))
        assert np.array_equal(got[r, 2], simd.lshr_by_i32_twin(x[r], y[r] & np.uint32(31)))
        assert np.array_equal(got[r, 3], simd.ashr_i32_twin(x[r], 24))
        assert np.array_equal(got[r, 4], simd.ashr_i32_twin(x[r], 7))
        assert np.array_equal(got[r, 5].view(np.float32), simd.f32_of_i32_twin(x[r]))
        powers = (y[r] & np.uint32(0x3F800000)).view(np.float32)
        assert np.array_equal(got[r, 6].view(np.float32),
                              simd.mul_f32_twin(simd.f32_of_i32_twin(simd.ashr_i32_twin(x[r], 24)), powers))
        assert np.array_equal(low_bytes[r], simd.store_low_bytes_twin(x[r]))


@njit
def _words(codes, out):
    for r in range(codes.shape[0]):
        for c in range(codes.shape[1] - 3):
            out[r, c] = simd.load_word(codes, r, c)


def test_load_word_reads_four_bytes_little_endian_at_any_offset():
    codes = np.random.default_rng(11).integers(0, 256, (3, 11), dtype=np.uint8)
    out = np.zeros((3, 8), np.uint32)
    _words(codes, out)
    assert all(out[r, c] == simd.load_word_twin(codes[r], c) for r in range(3) for c in range(8))

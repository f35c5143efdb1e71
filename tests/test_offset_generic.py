"""The one source of the offset block step's per-output arithmetic (mmaemu.arith.offset_step) compiled on scalars
and on the CPU's 512-bit vectors gives the same bits, lane by lane:

* every lane operation of mmaemu.arith.lanes, its scalar overload against its vector overload (mmaemu.cpu.simd),
  on the edge and random words of tests/test_simd.py (finite fp32 numbers for the fp32 operations);
* the step's start, correction flags and end, on scalars (as mmaemu.arith.offset runs them for cuda:offset and
  the reference) against vectors, for the shipped presets' constants of every format pair;
* the CPU engine's steps (mmaemu.cpu.offset_kernel's vector_start, vector_end and row_count, the generic source
  on vectors) against the same source on scalars, lane by lane.

Runs only where the offset engine runs (AVX-512 F/BW/DQ/VL, or AVX2 and FMA)."""

import numpy as np
import pytest
from numba import njit

from mmaemu.arith import lanes, offset_step
from mmaemu.arith.offset import ADD_MAX, offset_params
from mmaemu.arith.params import preset_params
from mmaemu.cpu import features, simd
from mmaemu.model.presets import ADA, HOPPER
from test_simd import word_rows

pytestmark = pytest.mark.skipif(features.offset_engine_decline(features.numba_target()) is not None,
                                reason="the target CPU has neither AVX-512 F/BW/DQ/VL nor AVX2 and FMA")


def finite_rows(seed):
    """word_rows with NaN and Inf patterns replaced by random finite ones (the fp32 operations' domain)."""
    rows = word_rows(seed)
    rng = np.random.default_rng(seed + 100)
    bad = (rows & 0x7F800000) == 0x7F800000
    rows[bad] = rng.integers(0, 0x7F000000, int(bad.sum()), dtype=np.uint64).astype(np.uint32) | (rows[bad] &
                                                                                                   0x80000000)
    return rows


BINARY_INT = ("add_i32", "sub_i32", "mul_i32", "and_i32", "or_i32", "xor_i32", "andnot_i32",
              "max_i32", "min_i32")


def _scalar_words(name):
    op = getattr(lanes, name)

    @njit
    def run(x, y, out):
        for r in range(x.shape[0]):
            for j in range(16):
                out[r, j] = np.uint32(op(np.int32(x[r, j]), np.int32(y[r, j])))
    return run


def _vector_words(name):
    op = getattr(lanes, name)

    @njit
    def run(x, y, out):
        for r in range(x.shape[0]):
            simd.store_f32(out.view(np.float32), r, 0,
                           lanes.f32_of_bits(op(simd.load_u32(x, r, 0), simd.load_u32(y, r, 0))))
    return run


@pytest.mark.parametrize("name", BINARY_INT)
def test_integer_lane_operations_on_scalars_equal_them_on_vectors(name):
    x, y = word_rows(1), word_rows(2)
    y = np.concatenate([y[1:], y[:1]])
    scalar, vector = np.zeros(x.shape, np.uint32), np.zeros(x.shape, np.uint32)
    _scalar_words(name)(x, y, scalar)
    _vector_words(name)(x, y, vector)
    assert np.array_equal(scalar, vector)


@njit
def _scalar_shifts(x, out):
    for r in range(x.shape[0]):
        for j in range(16):
            w = np.int32(x[r, j])
            out[3 * r, j] = np.uint32(lanes.shl_i32(w, 23))
            out[3 * r + 1, j] = np.uint32(lanes.lshr_i32(w, 23))
            out[3 * r + 2, j] = np.uint32(lanes.lshr_i32(w, 7))


@njit
def _vector_shifts(x, out):
    f = out.view(np.float32)
    for r in range(x.shape[0]):
        w = simd.load_u32(x, r, 0)
        simd.store_f32(f, 3 * r, 0, lanes.f32_of_bits(lanes.shl_i32(w, 23)))
        simd.store_f32(f, 3 * r + 1, 0, lanes.f32_of_bits(lanes.lshr_i32(w, 23)))
        simd.store_f32(f, 3 * r + 2, 0, lanes.f32_of_bits(lanes.lshr_i32(w, 7)))


def test_shifts_on_scalars_equal_them_on_vectors():
    x = word_rows(3)
    scalar, vector = np.zeros((3 * x.shape[0], 16), np.uint32), np.zeros((3 * x.shape[0], 16), np.uint32)
    _scalar_shifts(x, scalar)
    _vector_shifts(x, vector)
    assert np.array_equal(scalar, vector)
    assert np.array_equal(scalar[1::3], x >> 23)  # logical, not arithmetic


def _applied(name, arity):
    """A compiled ``apply(a, b, c)``: the lane operation ``name`` of its first ``arity`` arguments."""
    op = getattr(lanes, name)
    if arity == 1:
        return njit(lambda a, b, c: op(a))
    if arity == 2:
        return njit(lambda a, b, c: op(a, b))
    return njit(lambda a, b, c: op(a, b, c))


def _scalar_floats(apply):
    @njit
    def run(x, y, z, out):
        for r in range(x.shape[0]):
            for j in range(16):
                value = apply(lanes.f32_of_bits(np.int32(x[r, j])), lanes.f32_of_bits(np.int32(y[r, j])),
                              lanes.f32_of_bits(np.int32(z[r, j])))
                out[r, j] = np.uint32(lanes.bits_of_f32(value))
    return run


def _vector_floats(apply, toward_zero):
    """The vector kernel; ``toward_zero``: inside a toward-zero region (an "mxcsr" target's FMA rounds toward zero
    only there, and its other operations round to nearest only outside one)."""
    @njit
    def run(x, y, z, out):
        saved = simd.enter_toward_zero() if toward_zero else np.uint32(0)
        for r in range(x.shape[0]):
            value = apply(simd.load_f32(x.view(np.float32), r, 0), simd.load_f32(y.view(np.float32), r, 0),
                          simd.load_f32(z.view(np.float32), r, 0))
            simd.store_f32(out.view(np.float32), r, 0, value)
        if toward_zero:
            simd.leave_toward_zero(saved)
    return run


@pytest.mark.parametrize("name,arity", [("add_f32", 2), ("sub_f32", 2), ("max_f32", 2), ("abs_f32", 1),
                                        ("fma_toward_zero_f32", 3)])
def test_fp32_lane_operations_on_scalars_equal_them_on_vectors(name, arity):
    x, y, z = finite_rows(4), finite_rows(5), finite_rows(6)
    y, z = np.concatenate([y[1:], y[:1]]), np.concatenate([z[2:], z[:2]])
    x[0, :4] = [0x00000000, 0x80000000, 0x00000000, 0x80000000]  # +-0 against -+0 and itself (max's ties)
    y[0, :4] = [0x80000000, 0x00000000, 0x00000000, 0x80000000]
    scalar, vector = np.zeros(x.shape, np.uint32), np.zeros(x.shape, np.uint32)
    apply = _applied(name, arity)
    _scalar_floats(apply)(x, y, z, scalar)
    simd.call_restoring_mxcsr(_vector_floats(apply, name == "fma_toward_zero_f32"), x, y, z, vector)
    assert np.array_equal(scalar, vector)
    if name == "max_f32":
        assert list(scalar[0, :4]) == list(y[0, :4])  # of +0 and -0 the second


# ----------------------------------------------------------------------------------------------------------------
# The step itself

FORMAT_PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]
CASES = [(preset, pair) for preset in (HOPPER, ADA) for pair in FORMAT_PAIRS]


def _constants(preset, pair):
    return offset_params(preset_params(preset, *pair), *pair, ADD_MAX)


def step_inputs(seed, rows=32):
    """Byte-pass maxima e ([-128, 30], int32), accumulators c (finite fp32 up to 2**82, +-0, subnormals),
    offset sums s (fp32 near the M of random exponents), counts n (a byte sum below 256 each) and byte words."""
    rng = np.random.default_rng(seed)
    shape = (rows, 16)
    e = rng.integers(-128, 31, shape).astype(np.int32)
    e[0, :4] = [-128, -100, -85, 30]
    c = finite_rows(seed)[:rows].copy()
    c[((c >> 23) & 0xFF) > 0xD0] &= ~np.uint32(0x40000000)  # |c| below 2**82: M stays finite (condition 2)
    c[0, :6] = [0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x00800000]
    field = rng.integers(1, 254, shape).astype(np.uint32) << 23
    s = field | 0x400000 | rng.integers(-2**21, 2**21, shape).astype(np.int64).astype(np.uint32) & 0x7FFFFF
    n = (rng.integers(0, 64, shape + (4,)).astype(np.uint32) << np.arange(0, 32, 8, dtype=np.uint32)).sum(-1)
    words = [rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32) for _ in range(4)]
    return e, c, s.astype(np.uint32), n.astype(np.uint32), words


@njit
def _steps_on_scalars(e, c, s, n, a_words, b_words, constants, out):
    """out[0 ... 3] = the start's sum and threshold, the end, the byte counters after one group (lane by lane)."""
    v = offset_step.step_scalars(constants)
    low_b, sign_b = b_words
    for r in range(e.shape[0]):
        for j in range(16):
            product_bits = lanes.add_i32(lanes.shl_i32(np.int32(e[r, j]), 23), v.exponent_bias)
            acc, thresh = offset_step.step_start(product_bits, lanes.f32_of_bits(np.int32(c[r, j])), v, True)
            out[0, r, j] = np.uint32(lanes.bits_of_f32(acc))
            out[1, r, j] = np.uint32(thresh)
            count = lanes.lshr_i32(lanes.mul_i32(np.int32(n[r, j]), v.byte_sum), 24)  # the byte counters' sum
            out[2, r, j] = np.uint32(lanes.bits_of_f32(offset_step.step_end(lanes.f32_of_bits(np.int32(s[r, j])),
                                                                            count, v)))
            flags = offset_step.correction_flags(np.int32(a_words.low[r, 0]), np.int32(low_b[r, j]),
                                                 np.int32(a_words.sign[r, 0]), np.int32(sign_b[r, j]), thresh)
            out[3, r, j] = np.uint32(lanes.add_i32(np.int32(n[r, j]), lanes.lshr_i32(flags, 7)))


def _vector_steps():
    """A kernel running mmaemu.cpu.offset_kernel's vector_start, vector_end and row_count (one group, both vectors
    of a row alike; A's low and sign words of row r in the tile-major row r) into out[4, rows, 16]."""
    from mmaemu.cpu.offset_kernel import block_vectors, row_count, vector_end, vector_start

    @njit
    def run(e, c, s, n, a_tiles, b_words, constants, masks, out):
        v = block_vectors(constants, masks)  # vectors live in compiled code only (no boxing)
        f = out.view(np.float32)
        low_b, sign_b = b_words
        saved = simd.enter_toward_zero()
        for r in range(e.shape[0]):
            acc, thresh = vector_start(simd.load_u32(e.view(np.uint32), r, 0), simd.load_f32(c.view(np.float32), r, 0),
                                       v)
            simd.store_f32(f[0], r, 0, acc)
            simd.store_f32(f[1], r, 0, simd.f32_of_bits(thresh))
            n_r = simd.load_u32(n, r, 0)
            simd.store_f32(f[2], r, 0, vector_end(simd.load_f32(s.view(np.float32), r, 0), n_r, v))
            low, sign = simd.load_u32(low_b, r, 0), simd.load_u32(sign_b, r, 0)
            counted = row_count(a_tiles, r, 0, low, low, sign, sign, (thresh, thresh), (n_r, n_r))
            simd.store_f32(f[3], r, 0, simd.f32_of_bits(counted[1]))
        simd.leave_toward_zero(saved)

    return run


@pytest.mark.parametrize("preset,pair", CASES, ids=[f"{p.name}-{a}-{b}" for p, (a, b) in CASES])
def test_step_on_scalars_equals_the_vector_steps(preset, pair):
    """The generic step on scalars against the CPU engine's (the same source on vectors)."""
    from mmaemu.cpu import offset_kernel

    constants = _constants(preset, pair)
    e, c, s, n, words = step_inputs(7)
    a_words = offset_kernel.Operand(np.zeros((1, 16), np.float32), np.zeros((1, 16), np.uint32),
                                    words[0][:, :1].copy(), words[2][:, :1].copy())
    a_tiles = np.zeros((e.shape[0], offset_kernel.TILE_WORDS), np.uint32)
    a_tiles[:, offset_kernel.TILE_LOWS] = words[0][:, 0]
    a_tiles[:, offset_kernel.TILE_SIGNS] = words[2][:, 0]
    b_words = (words[1], words[3])
    scalar = np.zeros((4,) + e.shape, np.uint32)
    _steps_on_scalars(e, c, s, n, a_words, b_words, constants, scalar)
    vector = np.zeros_like(scalar)
    simd.call_restoring_mxcsr(_vector_steps(), e, c, s, n, a_tiles, b_words, constants, offset_kernel.MASKS, vector)
    assert np.array_equal(scalar, vector)

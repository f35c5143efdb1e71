"""torch's block-wise FP8 GEMM through cuBLASLt >= 12.9 (mmaemu.blockwise_cublaslt, profile
hopper-cublaslt-blockwise-experimental) against an independent restatement of Transformer Engine's zero-tolerance
reference ``CuBLASRefBlockwiseGemm`` (NVIDIA/TransformerEngine tests/pytorch/references/
blockwise_fp8_gemm_reference.py, stored version 7d5b5d99):

* each 128-k block is the oracle's tensor-wise ``scaled_mm`` of that block with scales 1 into fp32, slow
  accumulation (tests/oracle.py: TE's ``torch._scaled_mm(..., use_fast_accum=not use_split_accumulator)``);
* the partial enters the fp32 accumulator by ``fma(RN(p * s_first), s_second, y)`` written here with Fractions
  (s_first = the scale of A for 1x128 x 1x128 and 1x128 x 128x128, of B for 128x128 x 1x128);
* a bf16 bias is added in fp32 before the output cast; an existing output is added after it (TE's accumulate:
  "cublas accumulation first convert to output dtype, then accumulate").

The shapes and dtypes are TE's lists (tests/pytorch/test_float8_blockwise_gemm_exact.py, stored version 03328ccb),
the large ones marked slow; the scales are NOT powers of two (TE's quantiser makes them powers of two, for which
the three FMA orders coincide), and the adversarial test shows the orders give different bits.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import oracle

import mmaemu
from mmaemu.arith.scaled import (COMBINE_FMA_SCALE_A_FIRST, COMBINE_FMA_SCALE_B_FIRST, COMBINE_SCALED_FMA,
                                 combine_chunk)
from mmaemu.blockwise_cublaslt import scaled_mm_blockwise
from mmaemu.cpu.chunked import accumulate_chunked_codes
from mmaemu.errors import ExperimentalPresetWarning, ReferenceRejectsError, UnsupportedFeatureError
from mmaemu.model.chunked import CUBLASLT_BLOCKWISE, DEEPGEMM_SM90_1D2D

pytestmark = pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning")

PROFILE = "hopper-cublaslt-blockwise-experimental"
B1, B128 = (1, 128), (128, 128)
PAIRS = [(B1, B128), (B1, B1), (B128, B1)]  # TE's ids: 1Dx2D, 1Dx1D, 2Dx1D
PAIR_IDS = ["1Dx2D", "1Dx1D", "2Dx1D"]
ONE = 0x3F800000
HOPPER = oracle.PRESETS["hopper"]
DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


# ------------------------------------------------------------------------------------------------------------
# The restatement of TE's reference (oracle primitives and Fractions only)


def _rn_mul(x_bits, y_bits):
    """fp32 RN(x * y), exact rationals for finite operands (the oracle's rule for the others)."""
    x, y = oracle.fp32_value(x_bits), oracle.fp32_value(y_bits)
    if isinstance(x, str) or isinstance(y, str):
        return oracle.fp32_mul(x_bits, y_bits)
    negative = oracle.is_negative(x_bits, "float32") != oracle.is_negative(y_bits, "float32")
    return oracle.round_fp32(x * y, negative_zero=negative)


def _rn_fma(x_bits, y_bits, z_bits):
    """fp32 RN(x * y + z), one rounding of the exact rational (the oracle's integer FMA for non-finite values)."""
    x, y, z = (oracle.fp32_value(b) for b in (x_bits, y_bits, z_bits))
    if any(isinstance(v, str) for v in (x, y, z)):
        return oracle.fp32_fma(x_bits, y_bits, z_bits)
    exact = x * y + z
    both_negative_zero = exact == 0 and x * y == 0 and z == 0 and \
        oracle.is_negative(z_bits, "float32") and \
        (oracle.is_negative(x_bits, "float32") != oracle.is_negative(y_bits, "float32"))
    return oracle.round_fp32(exact, negative_zero=both_negative_zero)


def _accumulated(out_bits, c_bits, out):
    """TE's ``y = y + out`` after the cast: both widened to fp32, added, RN to the output dtype."""
    wide = [b if out == "float32" else b << 16 for b in (out_bits, c_bits)]
    x, y = (oracle.fp32_value(b) for b in wide)
    total = oracle.fp32_add(*wide) if isinstance(x, str) or isinstance(y, str) else oracle.round_fp32(x + y)
    if out == "float32":
        return oracle.CANONICAL_NAN_FP32 if oracle.fp32_value(total) == oracle.NAN else total
    return oracle.convert_fp32(total, "bfloat16")


def reference_one(a_row, b_row, fmt_a, fmt_b, sa_bits, sb_bits, scale_a_first, out, bias_bits=None, c_bits=None):
    """One output of CuBLASRefBlockwiseGemm.qgemm: ``sa_bits``/``sb_bits`` the fp32 scale of each 128-k block for
    this row of A and row of B; ``out`` "bfloat16" or "float32"; ``bias_bits`` a bf16 pattern or None;
    ``c_bits`` the pattern of the existing output to accumulate into (``accumulate=True``) or None."""
    bits = _reference_cast(a_row, b_row, fmt_a, fmt_b, sa_bits, sb_bits, scale_a_first, out, bias_bits)
    return bits if c_bits is None else _accumulated(bits, c_bits, out)


def _reference_cast(a_row, b_row, fmt_a, fmt_b, sa_bits, sb_bits, scale_a_first, out, bias_bits):
    y = 0
    for kb, k0 in enumerate(range(0, len(a_row), 128)):
        p = oracle.scaled_mm([a_row[k0:k0 + 128]], [b_row[k0:k0 + 128]], fmt_a, fmt_b, ONE, ONE, "float32", HOPPER,
                             False)[0][0]
        first, second = (sa_bits[kb], sb_bits[kb]) if scale_a_first else (sb_bits[kb], sa_bits[kb])
        y = _rn_fma(_rn_mul(p, first), second, y)
    if bias_bits is not None:
        bias = oracle.value_of(bias_bits, "bfloat16")
        value = oracle.fp32_value(y)
        y = oracle.fp32_add(y, oracle.round_fp32(bias)) if isinstance(value, str) else oracle.round_fp32(value + bias)
    if out == "float32":
        return oracle.CANONICAL_NAN_FP32 if oracle.fp32_value(y) == oracle.NAN else y
    return oracle.convert_fp32(y, "bfloat16")


# ------------------------------------------------------------------------------------------------------------
# Operands and scales in torch's two layouts


def _codes(rng, rows, K, fmt, magnitude=1.0):
    x = torch.from_numpy(rng.standard_normal((rows, K)).astype(np.float32) * magnitude)
    return x.to(DTYPES[fmt])


def _block_scales(rng, rows, chunks, block, pow2=False):
    """The fp32 scale matrix [rows or row blocks, chunks], not powers of two unless ``pow2``."""
    shape = (rows if block == B1 else -(-rows // 128), chunks)
    if pow2:
        return torch.from_numpy(np.ldexp(1.0, rng.integers(-8, 8, shape)).astype(np.float32))
    return torch.from_numpy(rng.uniform(0.25, 4.0, shape).astype(np.float32))


def _per_row(blocks, block, rows):
    """fp32 bits [rows][chunks] of the scale of each row's block."""
    values = blocks.numpy()
    if block == B128:
        values = np.repeat(values, 128, axis=0)[:rows]
    return values.view(np.uint32).astype(np.int64).tolist()


def _v1(blocks, block, operand):
    """torch._scaled_mm's layout (mmaemu.plan.blockwise)."""
    if block == B1:
        return blocks.t().contiguous().t() if operand == "a" else blocks.t().contiguous()
    return blocks.contiguous() if operand == "a" else blocks.contiguous().t()


def _v2(blocks, block):
    """F.scaled_mm's layout: 1x128 [rows, chunks] strides (1, rows); 128x128 [L4, row blocks] strides (1, L4)."""
    if block == B1:
        return blocks.t().contiguous().t()
    row_blocks, chunks = blocks.shape
    padded = torch.full((row_blocks, -(-chunks // 4) * 4), 1e30, dtype=torch.float32)  # the padding is never read
    padded[:, :chunks] = blocks
    return padded.t()


def _v1_reaches(M, K, N, pair):
    """Whether torch._scaled_mm's layout takes this call as block-wise (see V1_CASES)."""
    if pair == (B1, B1):
        return K > 128
    rows = M if pair[0] == B128 else N
    return rows <= 128 or -(-K // 128) % 4 == 0


class Case:
    """One GEMM: codes, scale blocks, and the restatement's outputs at chosen positions."""

    def __init__(self, M, K, N, fmt_a, fmt_b, pair, seed, pow2=False, magnitude=1.0):
        rng = np.random.default_rng(seed)
        self.M, self.K, self.N, self.fmt_a, self.fmt_b, self.pair = M, K, N, fmt_a, fmt_b, pair
        self.a = _codes(rng, M, K, fmt_a, magnitude)
        self.b = _codes(rng, N, K, fmt_b)  # rows of B: mat_b = b.t()
        chunks = -(-K // 128)
        self.sa = _block_scales(rng, M, chunks, pair[0], pow2)
        self.sb = _block_scales(rng, N, chunks, pair[1], pow2)
        self.rng = rng

    def v1(self, out_dtype, bias=None):
        return mmaemu.scaled_mm(self.a, self.b.t(), _v1(self.sa, self.pair[0], "a"), _v1(self.sb, self.pair[1], "b"),
                                bias=bias, out_dtype=out_dtype, profile=PROFILE)

    def v2(self, out_dtype, bias=None, **options):
        return scaled_mm_blockwise(self.a, self.b.t(), _v2(self.sa, self.pair[0]), _v2(self.sb, self.pair[1]),
                                   block_a=self.pair[0], block_b=self.pair[1], out_dtype=out_dtype, bias=bias,
                                   profile=PROFILE, **options)

    def positions(self, count):
        """Sampled outputs, the corners and the last row and column (block edges) always included."""
        fixed = [(0, 0), (self.M - 1, self.N - 1), (self.M - 1, 0), (0, self.N - 1)]
        drawn = zip(self.rng.integers(0, self.M, count).tolist(), self.rng.integers(0, self.N, count).tolist())
        return fixed + list(drawn)

    def expected(self, positions, out, bias=None, scale_a_first=None, existing=None):
        if scale_a_first is None:
            scale_a_first = self.pair != (B128, B1)
        a = self.a.view(torch.uint8).tolist()
        b = self.b.view(torch.uint8).tolist()
        sa, sb = _per_row(self.sa, self.pair[0], self.M), _per_row(self.sb, self.pair[1], self.N)
        bias_bits = None if bias is None else bias.view(torch.int16).numpy().astype(np.int64) & 0xFFFF
        c_bits = None if existing is None else _bits_at(existing, positions)
        return [reference_one(a[m], b[n], self.fmt_a, self.fmt_b, sa[m], sb[n], scale_a_first, out,
                              None if bias is None else int(bias_bits[n]), None if c_bits is None else c_bits[i])
                for i, (m, n) in enumerate(positions)]


def _bits_at(result, positions):
    flat = result.view(torch.int16 if result.dtype == torch.bfloat16 else torch.int32).numpy()
    mask = 0xFFFF if result.dtype == torch.bfloat16 else 0xFFFFFFFF
    return [int(flat[m, n]) & mask for m, n in positions]


# ------------------------------------------------------------------------------------------------------------
# TE's shape and dtype lists

TE_SHAPES = [(128, 128, 128), (256, 128, 256), (320, 128, 336), (320, 64, 336), (256, 256, 256), (320, 256, 336),
             (16, 128, 128)]
TE_SLOW_SHAPES = [(1024, 4096, 1024), (4096, 128, 4096)]


@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("shape", TE_SHAPES, ids=str)
def test_te_shapes_e4m3_against_the_restatement(shape, pair):
    """F.scaled_mm's form, E4M3 x E4M3 (the pair torch's F.scaled_mm takes), bf16 and fp32 outputs; the fp32
    result agrees with the bf16 one through one rounding of the same accumulator."""
    M, K, N = shape
    case = Case(M, K, N, "e4m3", "e4m3", pair, seed=M + K + N)
    where = case.positions(24)
    for out, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        assert _bits_at(case.v2(dtype), where) == case.expected(where, out)


@pytest.mark.slow
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("shape", TE_SLOW_SHAPES, ids=str)
def test_te_large_shapes_against_the_restatement(shape, pair):
    M, K, N = shape
    case = Case(M, K, N, "e4m3", "e4m3", pair, seed=7)
    where = case.positions(8)
    assert _bits_at(case.v2(torch.bfloat16), where) == case.expected(where, "bfloat16")


# E5M2 reaches cuBLASLt through torch._scaled_mm (F.scaled_mm's check_deepseek_recipe takes E4M3 only). Through
# _scaled_mm a 128x128 scale needs one row of blocks or a multiple of 4 blocks along K (mmaemu.plan.blockwise), and
# 1x128 x 1x128 scales with K <= 128 are row-wise scales (torch tries RowWise first): TE's K = 64 shape is taken
# with its 128x128 side cut to one row of blocks.
V1_CASES = [((256, 256, 256), (B1, B1)), ((320, 256, 336), (B1, B1)), ((16, 128, 128), (B1, B128)),
            ((128, 128, 128), (B128, B1)), ((320, 64, 128), (B1, B128)), ((128, 64, 336), (B128, B1)),
            ((256, 512, 256), (B1, B128)), ((256, 512, 256), (B128, B1))]
V1_IDS = [f"{shape}-{PAIR_IDS[PAIRS.index(pair)]}" for shape, pair in V1_CASES]


@pytest.mark.parametrize("formats", [("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e4m3", "e4m3")], ids=str)
@pytest.mark.parametrize("shape, pair", V1_CASES, ids=V1_IDS)
def test_te_dtypes_through_scaled_mm_against_the_restatement(shape, pair, formats):
    M, K, N = shape
    case = Case(M, K, N, *formats, pair, seed=K + len(formats[0]) + (pair == (B128, B1)))
    where = case.positions(16)
    for out, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        ours = case.v1(dtype)
        assert _bits_at(ours, where) == case.expected(where, out)
        if formats == ("e4m3", "e4m3"):  # the two layouts describe one call: the same bits
            assert torch.equal(ours.view(torch.uint8), case.v2(dtype).view(torch.uint8))


@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("shape", [(256, 128, 256), (320, 64, 336), (256, 256, 256)], ids=str)
def test_te_bias_is_added_in_fp32_before_the_cast(shape, pair):
    """TE's bias list (bf16 bias; torch takes it with a bf16 output only), x magnitude 1e-3 as TE's bias tests,
    so that the bias dominates and the order (fp32 add, then one cast) decides the bits."""
    M, K, N = shape
    case = Case(M, K, N, "e4m3", "e4m3", pair, seed=3, magnitude=1e-3)
    bias = torch.from_numpy(case.rng.standard_normal(N).astype(np.float32)).to(torch.bfloat16)
    where = case.positions(24)
    ours = case.v2(torch.bfloat16, bias=bias)
    assert _bits_at(ours, where) == case.expected(where, "bfloat16", bias=bias)
    if _v1_reaches(M, K, N, pair):
        assert torch.equal(ours.view(torch.uint8), case.v1(torch.bfloat16, bias=bias).view(torch.uint8))
    # bf16(y) + bias in bf16 (DeepGEMM's layer order) differs somewhere: the test can tell the orders apart
    unbiased = case.v2(torch.bfloat16).float()
    late = (unbiased + bias.float()).to(torch.bfloat16)
    assert not torch.equal(late.view(torch.uint8), ours.view(torch.uint8))


@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("shape", [(256, 128, 256), (320, 256, 336)], ids=str)
def test_te_accumulate_converts_first_then_adds(shape, pair):
    """TE's accumulate list (``out = randn(M, N) * x_magnitude`` of the output dtype, magnitudes 1e-28, 1, 1e3, with
    and without a bias): the result is cast, then added to the existing output in fp32 and cast again; adding
    before the cast gives other bits somewhere (so the test can tell the orders apart)."""
    M, K, N = shape
    for magnitude in (1e-28, 1.0, 1e3):
        case = Case(M, K, N, "e4m3", "e4m3", pair, seed=13, magnitude=magnitude)
        where = case.positions(12)
        for dtype, out in ((torch.bfloat16, "bfloat16"), (torch.float32, "float32")):
            existing = (torch.from_numpy(case.rng.standard_normal((M, N)).astype(np.float32)) * magnitude).to(dtype)
            bias = torch.from_numpy(case.rng.standard_normal(N).astype(np.float32)).to(torch.bfloat16) \
                if dtype == torch.bfloat16 else None
            got = case.v2(dtype, bias=bias, accumulate_into=existing)
            assert _bits_at(got, where) == case.expected(where, out, bias=bias, existing=existing)
    case = Case(M, K, N, "e4m3", "e4m3", pair, seed=13)
    existing = torch.from_numpy(case.rng.standard_normal((M, N)).astype(np.float32)).to(torch.bfloat16)
    single = (case.v2(torch.float32) + existing.float()).to(torch.bfloat16)  # one cast of y + c
    twice = case.v2(torch.bfloat16, accumulate_into=existing)
    assert not torch.equal(single.view(torch.int16), twice.view(torch.int16))
    with pytest.raises(ValueError, match="accumulate_into must be"):
        case.v2(torch.bfloat16, accumulate_into=existing.float())


def test_te_magnitudes_and_pow2_scales():
    """TE's magnitude list (1e-28, 1, 1e3 with power-of-two scales as its quantiser makes them): the same
    restatement; with power-of-two scales all three FMA orders give the same bits (the products are exact)."""
    for magnitude in (1e-28, 1.0, 1e3):
        for pair in PAIRS:
            case = Case(256, 256, 256, "e4m3", "e4m3", pair, seed=11, pow2=True, magnitude=magnitude)
            where = case.positions(12)
            got = _bits_at(case.v2(torch.float32), where)
            assert got == case.expected(where, "float32")
            assert got == case.expected(where, "float32", scale_a_first=pair == (B128, B1))


# ------------------------------------------------------------------------------------------------------------
# The orders differ (so these tests can fail)


def test_the_three_combine_orders_give_different_bits():
    """Adversarial triples where RN(p * sa) * sb, RN(p * sb) * sa and RN(sa * sb) * p (one FMA each) differ, each
    equal to the restatement's exact-rational FMA; then a whole GEMM where the kernels' bits differ."""
    rng = np.random.default_rng(5)
    p = rng.uniform(1, 2, 4000).astype(np.float32)
    sa = rng.uniform(1, 2, 4000).astype(np.float32)
    sb = rng.uniform(1, 2, 4000).astype(np.float32)
    y = rng.uniform(-4, 4, 4000).astype(np.float32)
    seen = set()
    for i in range(p.size):
        args = (np.float32(y[i]), np.float32(p[i]), np.float32(sa[i]), np.float32(sb[i]))
        bits = {rule: int(np.float32(combine_chunk(rule, *args)).view(np.uint32))
                for rule in (COMBINE_FMA_SCALE_A_FIRST, COMBINE_FMA_SCALE_B_FIRST, COMBINE_SCALED_FMA)}
        pb, ab, bb, yb = (int(v.view(np.uint32)) for v in (args[1], args[2], args[3], args[0]))
        assert bits[COMBINE_FMA_SCALE_A_FIRST] == _rn_fma(_rn_mul(pb, ab), bb, yb)
        assert bits[COMBINE_FMA_SCALE_B_FIRST] == _rn_fma(_rn_mul(pb, bb), ab, yb)
        assert bits[COMBINE_SCALED_FMA] == _rn_fma(_rn_mul(ab, bb), pb, yb)
        seen.add(len(set(bits.values())))
    assert 3 in seen  # all three different for some triple
    case = Case(64, 512, 64, "e4m3", "e4m3", (B1, B1), seed=9)
    rows_a = np.array(_per_row(case.sa, B1, 64), np.uint32).view(np.float32)
    rows_b = np.array(_per_row(case.sb, B1, 64), np.uint32).view(np.float32)
    a, b = case.a.view(torch.uint8).numpy(), case.b.view(torch.uint8).numpy()
    finals = [accumulate_chunked_codes(a, b, "e4m3", "e4m3", rows_a, rows_b, kernel).view(np.uint32)
              for kernel in (CUBLASLT_BLOCKWISE[(B1, B1)], CUBLASLT_BLOCKWISE[(B128, B1)], DEEPGEMM_SM90_1D2D)]
    assert (finals[0] != finals[1]).any() and (finals[0] != finals[2]).any() and (finals[1] != finals[2]).any()


@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_adversarial_codes_and_scales_against_the_restatement(pair):
    """Every output of a small GEMM through torch._scaled_mm's layout: E5M2 Inf and NaN codes in some blocks, huge
    scales (a partial times its scale overflows), tiny ones (subnormal products), zero scales (0 x Inf is NaN),
    cancellation between blocks; bf16 and fp32 outputs."""
    case = Case(8, 512, 16, "e5m2", "e4m3", pair, seed=21, magnitude=1e4)
    a = case.a.view(torch.uint8)
    a[1, 130] = 0x7C  # +Inf in block 1 of row 1
    a[2, 300] = 0x7E  # NaN in block 2 of row 2
    a[3, 5], a[3, 400] = 0x7C, 0xFC  # +Inf and -Inf in two blocks: Inf - Inf
    a[4, :128] = a[4, 128:256]  # the same block twice, the second scaled negative below: cancellation
    sa, sb = case.sa, case.sb
    if pair[0] == B1:
        sa[4, 1] = -sa[4, 0]
        sa[5] = torch.tensor([3e38, 1.0, 1e-38, 0.0])
        sa[6, 2] = 0.0
        sa[1, 3] = 1e-45
    sb.view(-1)[3] = 2.0**100
    sb.view(-1)[-1] = 2.0**-140
    every = [(m, n) for m in range(8) for n in range(16)]
    for out, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        got = _bits_at(case.v1(dtype), every)
        want = case.expected(every, out)
        nan = oracle.CANONICAL_NAN_FP32 if out == "float32" else oracle.BF16_NAN
        assert got == want, [(p, g, w) for p, g, w in zip(every, got, want) if g != w][:5]
        assert nan in want and any(w in (0x7F800000, 0x7F80, 0xFF800000, 0xFF80) for w in want)


@pytest.mark.parametrize("kernel", [CUBLASLT_BLOCKWISE[(B1, B1)], CUBLASLT_BLOCKWISE[(B128, B1)]],
                         ids=["a-first", "b-first"])
def test_engine_fast_paths_equal_the_reference_engine(kernel):
    """The fused E4M3 path, the per-chunk path (E5M2) and backend='reference' give the same bits, NaN codes and
    huge, tiny and non-power-of-two scales included (overflow to Inf, subnormal products)."""
    rng = np.random.default_rng(2)
    for fmt_b in ("e4m3", "e5m2"):
        a = _codes(rng, 40, 300, "e4m3").view(torch.uint8).numpy().copy()
        b = _codes(rng, 24, 300, fmt_b, 100.0).view(torch.uint8).numpy().copy()
        a[3, 17] = 0x7F  # NaN code
        sa = rng.uniform(0.1, 10, (40, 3)).astype(np.float32)
        sb = rng.uniform(0.1, 10, (24, 3)).astype(np.float32)
        sa[5] = 3e37
        sa[6] = 1e-40
        fast = accumulate_chunked_codes(a, b, "e4m3", fmt_b, sa, sb, kernel)
        slow = accumulate_chunked_codes(a, b, "e4m3", fmt_b, sa, sb, kernel, reference=True)
        both_nan = np.isnan(fast) & np.isnan(slow)  # the NaN payload of an accumulator is not an output
        assert np.array_equal(np.where(both_nan, 0, fast.view(np.uint32)), np.where(both_nan, 0, slow.view(np.uint32)))
        assert np.isnan(fast[3]).all() and np.isnan(slow[3]).all() and np.isinf(fast[5]).any()


def test_each_block_is_the_tensorwise_gemm_of_that_block():
    """With scales 1 and K <= 128 the result is the tensor-wise slow-accumulation GEMM of the block
    (mmaemu.accumulate on the hopper preset), K = 64 (a block shorter than 128) included."""
    for K in (64, 128):
        case = Case(32, K, 48, "e4m3", "e4m3", (B1, B1), seed=K)
        case.sa.fill_(1.0)
        case.sb.fill_(1.0)
        ours = case.v2(torch.float32)
        acc = mmaemu.accumulate(case.a, case.b, use_fast_accum=False, profile="hopper", splitk=1)
        assert torch.equal(ours.view(torch.int32), (acc + 0.0).view(torch.int32))  # + 0.0: -0 is +0 after y = +0


# ------------------------------------------------------------------------------------------------------------
# Validation: torch's rules, the profiles, the scope


def _case(pair=(B1, B128), M=256, K=256, N=256):
    return Case(M, K, N, "e4m3", "e4m3", pair, seed=1)


def test_hopper_refuses_as_torch_2_7_1_and_names_the_profile():
    case = _case((B1, B1))
    with pytest.raises(ReferenceRejectsError, match=f"Invalid scaling configuration.*profile '{PROFILE}'"):
        mmaemu.scaled_mm(case.a, case.b.t(), _v1(case.sa, B1, "a"), _v1(case.sb, B1, "b"), out_dtype=torch.bfloat16,
                         profile="hopper")
    with pytest.raises(ReferenceRejectsError, match=f"requires cublasLt >= 12.9.*{PROFILE}"):
        scaled_mm_blockwise(case.a, case.b.t(), _v2(case.sa, B1), _v2(case.sb, B1), block_a=B1, block_b=B1,
                            profile="hopper")


def test_torch_rules_are_reference_rejections():
    case = _case()
    sa, sb = _v2(case.sa, B1), _v2(case.sb, B128)
    call = dict(block_a=B1, block_b=B128, profile=PROFILE)
    with pytest.raises(ReferenceRejectsError, match="doesn't support fast accum with 128x128 blockwise scaling"):
        scaled_mm_blockwise(case.a, case.b.t(), sa, sb, use_fast_accum=True, **call)
    with pytest.raises(ReferenceRejectsError, match="float8_e4m3fn operands only"):
        scaled_mm_blockwise(case.a, case.b.to(torch.float8_e5m2).t(), sa, sb, **call)
    with pytest.raises(ReferenceRejectsError, match="strides"):
        scaled_mm_blockwise(case.a, case.b.t(), case.sa.contiguous(), sb, **call)  # 1x128 scales must be (1, M)
    with pytest.raises(ReferenceRejectsError, match="must have shape"):
        scaled_mm_blockwise(case.a, case.b.t(), sa, case.sb.contiguous().t(), **call)  # 128x128 needs the padding
    with pytest.raises(ReferenceRejectsError, match="not one of cuBLASLt's pairs"):
        scaled_mm_blockwise(case.a, case.b.t(), sa, sb, block_a=B128, block_b=B128, profile=PROFILE)
    with pytest.raises(ReferenceRejectsError, match="Bias is not supported when out_dtype is set to Float32"):
        scaled_mm_blockwise(case.a, case.b.t(), sa, sb, out_dtype=torch.float32,
                            bias=torch.zeros(256, dtype=torch.bfloat16), **call)
    with pytest.raises(ReferenceRejectsError, match="row-major and column-major"):
        scaled_mm_blockwise(case.a, case.b.t().contiguous(), sa, sb, **call)
    short = Case(256, 120, 256, "e4m3", "e4m3", (B1, B1), seed=1)  # TE: K must be a multiple of 16
    with pytest.raises(ReferenceRejectsError, match="divisible by 16"):
        short.v2(torch.bfloat16)
    with pytest.raises(ReferenceRejectsError, match="Invalid scaling configuration"):  # 2D x 2D is not a v1 pair
        mmaemu.scaled_mm(case.a, case.b.t(), _v1(_case((B128, B1)).sa, B128, "a"), _v1(case.sb, B128, "b"),
                         out_dtype=torch.bfloat16, profile=PROFILE)


def test_scope_refusals_name_the_way_out():
    with pytest.raises(UnsupportedFeatureError, match="M = 255 with 1x128 scales"):
        Case(255, 128, 256, "e4m3", "e4m3", (B1, B128), seed=1).v2(torch.bfloat16)
    wide = Case(255, 128, 256, "e4m3", "e4m3", (B128, B1), seed=1)  # TE: M unconstrained with 128x128 scales on A
    where = wide.positions(6)
    assert _bits_at(wide.v2(torch.bfloat16), where) == wide.expected(where, "bfloat16")
    case = _case((B128, B1))
    with pytest.raises(UnsupportedFeatureError, match="bfloat16 and float32 outputs only"):
        case.v2(torch.float16)
    with pytest.raises(UnsupportedFeatureError, match="not a multiple of 4.*scaled_mm_blockwise"):
        case.v1(torch.bfloat16)  # K = 256: 2 blocks along K, 2 rows of blocks
    with pytest.raises(UnsupportedFeatureError, match="splitk=2"):
        case.v2(torch.bfloat16, splitk=2)


def test_f_scaled_mm_argument_forms():
    """F.scaled_mm hands _scaled_mm_v2 one-element scale lists and ScalingType members: both are taken."""
    from torch.nn.functional import ScalingType

    case = _case((B128, B1))
    want = case.v2(torch.bfloat16)
    got = scaled_mm_blockwise(case.a, case.b.t(), [_v2(case.sa, B128)], [_v2(case.sb, B1)],
                              block_a=ScalingType.BlockWise128x128, block_b=ScalingType.BlockWise1x128,
                              profile=PROFILE)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    with pytest.raises(ValueError, match="block_a must be"):
        scaled_mm_blockwise(case.a, case.b.t(), _v2(case.sa, B128), _v2(case.sb, B1), block_a=ScalingType.RowWise,
                            block_b=B1, profile=PROFILE)


def test_explain_names_the_kernel_and_the_assumed_split():
    case = _case((B1, B1))
    plan = mmaemu.explain(case.a, case.b.t(), _v1(case.sa, B1, "a"), _v1(case.sb, B1, "b"), out_dtype=torch.bfloat16,
                          profile=PROFILE)
    assert plan.validation == "ok" and plan.kernel.startswith("cuBLASLt block-wise")
    assert plan.split.S == 1 and "no split-K table" in plan.split.note
    assert any("modelled from a public zero-tolerance reference, not recorded" in w for w in plan.warnings)


def test_maturity_warns_once_per_pair(fresh_warnings):
    case = _case((B1, B1))
    with pytest.warns(ExperimentalPresetWarning, match="modelled from a public zero-tolerance reference"):
        case.v2(torch.bfloat16)


def test_short_k_one_by_128_scales_are_rowwise_through_scaled_mm():
    """torch._scaled_mm tries RowWise before the block-wise pairs: [M, 1] x [1, N] scales (1x128 x 1x128 at
    K <= 128) are row-wise, which this profile refuses (cuBLASLt's row-wise epilogue is not recorded)."""
    case = Case(64, 64, 64, "e4m3", "e4m3", (B1, B1), seed=1)
    with pytest.raises(UnsupportedFeatureError, match="row-wise"):
        case.v1(torch.bfloat16)
    where = case.positions(8)
    assert _bits_at(case.v2(torch.bfloat16), where) == case.expected(where, "bfloat16")


def test_the_profile_is_listed_and_refuses_rowwise():
    assert PROFILE in mmaemu.list_profiles()
    profile = mmaemu.get_profile(PROFILE)
    assert profile.maturity == "experimental" and profile.splitk_table is None and profile.capability == (9, 0)
    a = torch.randn(32, 64).to(torch.float8_e4m3fn)
    b = torch.randn(32, 64).to(torch.float8_e4m3fn)
    with pytest.raises(UnsupportedFeatureError, match="row-wise"):
        mmaemu.scaled_mm(a, b.t(), torch.ones(32, 1), torch.ones(1, 32), out_dtype=torch.bfloat16, profile=PROFILE)


# ------------------------------------------------------------------------------------------------------------
# The block-wise layer


def test_blockwise_layer_kernel_option():
    """BlockwiseFP8Linear(kernel="cublaslt") runs F.scaled_mm's model on its casts (rows padded to 4, bias in the
    epilogue); with power-of-two scales (use_ue8m0) and no bias it equals DeepGEMM's layer (the orders coincide)."""
    torch.manual_seed(4)
    linear = torch.nn.Linear(256, 144)
    x = torch.randn(5, 256)
    from mmaemu.nn_recipes import BlockwiseFP8Linear

    with torch.no_grad():
        layer = mmaemu.nn.EmulatedFP8Linear.from_linear(linear, recipe="blockwise", kernel="cublaslt")
        assert layer.kernel == "cublaslt" and "kernel='cublaslt'" in repr(layer)
        y = layer(x)
        (x_fp8, sfa), _ = layer._quantise_input(x)
        a = torch.zeros(8, 256, dtype=x_fp8.dtype)
        a[:5] = x_fp8
        sa = torch.ones(8, 2)
        sa[:5] = sfa
        sb = torch.zeros(2, 4)
        sb[:, :2] = layer.weight_scale
        want = scaled_mm_blockwise(a, layer.weight.t(), sa.t().contiguous().t(), sb.t(), block_a=B1, block_b=B128,
                                   bias=layer.bias, profile=PROFILE)[:5]
        assert torch.equal(y.view(torch.int32), want.float().view(torch.int32))
        unbiased = torch.nn.Linear(256, 144, bias=False)
        unbiased.weight.copy_(linear.weight)
        ours = BlockwiseFP8Linear.from_linear(unbiased, use_ue8m0=True, kernel="cublaslt")(x)
        theirs = BlockwiseFP8Linear.from_linear(unbiased, use_ue8m0=True)(x)
        assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))
    with pytest.raises(ValueError, match="kernel must be one of"):
        BlockwiseFP8Linear.from_linear(linear, kernel="cutlass")


def test_kernel_records_are_data():
    """The three records differ only in the combine rule; a call's output mode is set by its dtype and bias."""
    from mmaemu.blockwise_cublaslt import kernel_for

    kernels = [CUBLASLT_BLOCKWISE[pair] for pair in PAIRS]
    assert {dataclasses.replace(k, name="", combine=0) for k in kernels} == \
        {dataclasses.replace(kernels[0], name="", combine=0)}
    assert [k.combine for k in kernels] == [COMBINE_FMA_SCALE_A_FIRST, COMBINE_FMA_SCALE_A_FIRST,
                                            COMBINE_FMA_SCALE_B_FIRST]
    modes = {kernel_for(B1, B1, dtype, bias).output for dtype in (torch.bfloat16, torch.float32)
             for bias in (False, True)}
    assert len(modes) == 4 and all("TransformerEngine" in k.source for k in kernels)


def test_a_cached_plan_keeps_the_bias():
    """The plan cache rebinds a block-wise call's bias on a hit (it once dropped every bias but row-wise ones)."""
    case = Case(64, 256, 64, "e4m3", "e4m3", (B1, B1), seed=6)
    bias = torch.full((64,), 0.5, dtype=torch.bfloat16)
    first = case.v1(torch.bfloat16, bias=bias)
    second = case.v1(torch.bfloat16, bias=bias * 2)
    where = case.positions(6)
    assert _bits_at(first, where) == case.expected(where, "bfloat16", bias=bias)
    assert _bits_at(second, where) == case.expected(where, "bfloat16", bias=bias * 2)

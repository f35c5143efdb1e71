"""Block-scaled GEMMs (semantics.md b.5): every output one chain of the instruction along K. The CPU fast path, the
reference loop and ``model.dot``'s chains give the same bits on random and adversarial inputs (the whole UE8M0 /
UE4M3 scale range, the NaN scale code, zero blocks, FP4/FP6 operands, overflow and underflow)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import mmaemu
from mmaemu import formats
from mmaemu.cpu.block_scaled import BlockScaledGemm, _run_fast_blocks, accumulate_block_scaled
from test_mmasim_block_scale import make_cases

FORMATS = ("e5m2", "e4m3", "e3m2", "e2m3", "e2m1")
SCALED_KINDS = [("tcgen05_mxf4nvf4", 16, "ue4m3"), ("tcgen05_mxf4nvf4", 16, "ue8m0"),
                ("tcgen05_mxf4nvf4", 32, "ue8m0"), ("sm120_mxf4nvf4", 16, "ue4m3")]


def _preset(name):
    return mmaemu.get_preset(name, warn=False)


def _operands(fmt_a, fmt_b, M, N, K, block, scale_fmt, seed):
    """A [M, K], B [N, K] codes and their scales: rows of the adversarial case kinds of the MMA-Sim test."""
    a = make_cases(fmt_a, fmt_b, K, block, scale_fmt, M, seed)
    b = make_cases(fmt_b, fmt_a, K, block, scale_fmt, N, seed + 1)
    return a.a, b.a, a.sa, b.sa


def _dot_chains(preset, fmt_a, fmt_b, a, b, sa, sb, scale_fmt):
    """model.dot over every (m, n) pair: the instruction-level chain of each output from +0."""
    M, N = a.shape[0], b.shape[0]
    rows_a, rows_b = np.repeat(a, N, axis=0), np.tile(b, (M, 1))
    srows_a, srows_b = np.repeat(sa, N, axis=0), np.tile(sb, (M, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mmaemu.ExperimentalPresetWarning)
        out = mmaemu.model.dot(torch.from_numpy(rows_a), torch.from_numpy(rows_b), torch.zeros(M * N),
                               preset=preset, fmt=(fmt_a, fmt_b), scale_a=torch.from_numpy(srows_a),
                               scale_b=torch.from_numpy(srows_b), scale_fmt=scale_fmt)
    return out.numpy().view(np.uint32).reshape(M, N)


def _check(preset_name, fmt_a, fmt_b, M, N, K, block, scale_fmt, seed):
    preset = _preset(preset_name)
    a, b, sa, sb = _operands(fmt_a, fmt_b, M, N, K, block, scale_fmt, seed)
    fast = accumulate_block_scaled(a, b, fmt_a, fmt_b, sa, sb, scale_fmt, preset).view(np.uint32)
    ref = accumulate_block_scaled(a, b, fmt_a, fmt_b, sa, sb, scale_fmt, preset, reference=True).view(np.uint32)
    dot = _dot_chains(preset, fmt_a, fmt_b, a, b, sa, sb, scale_fmt)
    for name, other in (("reference", ref), ("model.dot", dot)):
        bad = np.argwhere(fast != other)
        assert not bad.size, (f"{preset_name} {fmt_a}x{fmt_b}: {len(bad)} of {M * N} outputs differ from {name}; "
                              f"first {bad[0].tolist()}: fast {fast[tuple(bad[0])]:08X}, {name} "
                              f"{other[tuple(bad[0])]:08X}")
    return fast


@pytest.mark.parametrize("fmt_a", FORMATS)
@pytest.mark.parametrize("fmt_b", FORMATS)
def test_mxf8f6f4_gemm_fast_equals_reference_and_dot(fmt_a, fmt_b):
    _check("tcgen05_mxf8f6f4", fmt_a, fmt_b, 11, 37, 128, 32, "ue8m0", seed=hash((fmt_a, fmt_b)) % 1000)


@pytest.mark.parametrize("preset,block,scale_fmt", SCALED_KINDS)
def test_mxf4nvf4_gemm_equals_reference_and_dot(preset, block, scale_fmt):
    _check(preset, "e2m1", "e2m1", 9, 21, 192, block, scale_fmt, seed=block)


def test_sm120_mxf8f6f4_gemm_and_outputs_that_leave_the_fast_path():
    out = _check("sm120_mxf8f6f4", "e4m3", "e5m2", 23, 70, 96, 32, "ue8m0", seed=7)
    bits = out.reshape(-1)
    assert (bits == 0x7FFFFFFF).any()  # NaN scales and NaN elements reached some outputs
    assert np.isinf(bits.view(np.float32)).any()  # and overflow others


def test_k_must_be_whole_instructions():
    preset = _preset("tcgen05_mxf8f6f4")
    a = np.zeros((2, 48), np.uint8)
    with pytest.raises(ValueError, match="scales"):
        accumulate_block_scaled(a, a, "e4m3", "e4m3", np.zeros((2, 2), np.uint8), np.zeros((2, 2), np.uint8),
                                "ue8m0", preset)
    a = np.zeros((2, 16), np.uint8)
    with pytest.raises(ValueError, match="K = 16 is not a whole number of 'mx16' instructions"):
        accumulate_block_scaled(a, a, "e4m3", "e4m3", np.zeros((2, 1), np.uint8), np.zeros((2, 1), np.uint8),
                                "ue8m0", _preset("tcgen05_mxf8f6f4").variant("mx16", scale_kinds=((16, "ue8m0"),)))


@pytest.mark.parametrize("fmt_a,fmt_b", [("e4m3", "e4m3"), ("e5m2", "e2m1"), ("e3m2", "e2m3")])
def test_the_fast_path_alone_covers_finite_inputs_over_the_whole_scale_range(fmt_a, fmt_b):
    """Finite elements and scales 2**-127 .. 2**127 (no NaN code): the tiles compute every output that stays
    below 2**128 themselves, subnormal and zero results included, and equal the reference."""
    rng = np.random.default_rng(5)
    M, N, K = 13, 40, 256
    a = rng.choice(np.flatnonzero(~formats.nonfinite_codes(fmt_a)), (M, K)).astype(np.uint8)
    b = rng.choice(np.flatnonzero(~formats.nonfinite_codes(fmt_b)), (N, K)).astype(np.uint8)
    a[:, 64:96] = 0  # a zero block
    sa = rng.integers(0, 255, (M, K // 32)).astype(np.uint8)
    sb = rng.integers(0, 255, (N, K // 32)).astype(np.uint8)
    sa[:6], sb[:20] = rng.integers(45, 53, (6, K // 32)), rng.integers(45, 53, (20, K // 32))  # near 2**-140
    gemm = BlockScaledGemm(a, b, fmt_a, fmt_b, sa, sb, "ue8m0", _preset("tcgen05_mxf8f6f4"))
    fast = np.zeros((M, N), np.float32)
    handed_over = _run_fast_blocks(gemm, fast)
    ref = accumulate_block_scaled(a, b, fmt_a, fmt_b, sa, sb, "ue8m0", gemm.preset, reference=True)
    covered = ~handed_over
    assert covered.mean() > 0.2  # the rest reach 2**128 (random scale sums up to 2**254)
    assert np.array_equal(fast.view(np.uint32)[covered], ref.view(np.uint32)[covered])
    finite = np.abs(ref[covered])
    assert (finite < 2.0 ** -126).any() and (finite > 2.0 ** 60).any()


@pytest.mark.parametrize("preset,block,scale_fmt", [("tcgen05_mxf4nvf4", 16, "ue4m3"), ("sm120_mxf4nvf4", 32, "ue8m0")])
def test_the_group_fast_path_alone_covers_finite_nvfp4_inputs(preset, block, scale_fmt):
    """kind::mxf4nvf4 tiles: zero groups, cancelling groups, zero UE4M3 scales, the whole scale range (no NaN code)
    give the reference's bits without a hand-over."""
    rng = np.random.default_rng(8)
    M, N, K = 9, 36, 192
    a, b = rng.integers(0, 16, (M, K)).astype(np.uint8), rng.integers(0, 16, (N, K)).astype(np.uint8)
    a[:, 16:32] = 0  # a zero group
    a[:3, 48:64], b[:, 48:64] = 1, 1  # all products 0.25 ...
    a[:3, 56:64] = 9  # ... half of them -0.25: a group that cancels to zero
    top = 0x7F if scale_fmt == "ue4m3" else 0xFF
    sa, sb = (rng.integers(0, top, (rows, K // block)).astype(np.uint8) for rows in (M, N))
    if scale_fmt == "ue8m0":
        sa, sb = sa // 4 + 96, sb // 4 + 96  # 2**-31 .. 2**32: no result reaches 2**128
    gemm = BlockScaledGemm(a, b, "e2m1", "e2m1", sa, sb, scale_fmt, _preset(preset))
    fast = np.zeros((M, N), np.float32)
    handed_over = _run_fast_blocks(gemm, fast)
    ref = accumulate_block_scaled(a, b, "e2m1", "e2m1", sa, sb, scale_fmt, gemm.preset, reference=True)
    assert not handed_over.any()
    assert np.array_equal(fast.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("preset,fmt,K,block,scale_fmt", [("tcgen05_mxf8f6f4", "e4m3", 128, 32, "ue8m0"),
                                                          ("tcgen05_mxf8f6f4", "e2m3", 96, 32, "ue8m0"),
                                                          ("tcgen05_mxf4nvf4", "e2m1", 128, 16, "ue4m3")])
def test_gemm_equals_chains_of_the_fraction_oracle(preset, fmt, K, block, scale_fmt):
    """Every output of a small GEMM (finite data, scales from 2**-40 to 2**40) equals the chain of the design
    note's instruction rules computed with fractions (tests/test_block_scaled.py's oracle)."""
    from test_block_scaled import oracle_mxf4, oracle_mxf8

    rng = np.random.default_rng(17)
    M, N = 3, 8
    finite = np.flatnonzero(~formats.nonfinite_codes(fmt))
    a, b = rng.choice(finite, (M, K)).astype(np.uint8), rng.choice(finite, (N, K)).astype(np.uint8)
    a[0, :block] = 0  # a zero block at the start of a chain
    if scale_fmt == "ue8m0":
        sa, sb = (rng.integers(87, 168, (rows, K // block)).astype(np.uint8) for rows in (M, N))
    else:
        sa, sb = (rng.integers(0, 0x7F, (rows, K // block)).astype(np.uint8) for rows in (M, N))
    out = accumulate_block_scaled(a, b, fmt, fmt, sa, sb, scale_fmt, _preset(preset)).view(np.uint32)
    k = _preset(preset).nfma
    for m in range(M):
        for n in range(N):
            c = 0
            for i in range(K // k):
                x, y = a[m, i * k:(i + 1) * k], b[n, i * k:(i + 1) * k]
                s, t = sa[m, i * k // block:(i + 1) * k // block], sb[n, i * k // block:(i + 1) * k // block]
                c = oracle_mxf8(x, y, s, t, c, fmt, fmt) if k == 32 else oracle_mxf4(x, y, s, t, c, block, scale_fmt)
            assert int(out[m, n]) == c, (m, n, f"{int(out[m, n]):08X}", f"{c:08X}")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e3m2", "e2m3", "e2m1"])
def test_one_tile_table_per_format_in_the_tile_layout(fmt):
    """The tile tables of every operand format (mmaemu.cpu.engine.tile_tables; the FP8 ones tabulate tile_decode)
    hold each finite code's value and exponent from mmaemu.formats, and 0 with the absent exponent for zero and
    non-finite codes."""
    from mmaemu.arith.tile import TILE_ABSENT_EXP
    from mmaemu.cpu.engine import tile_tables

    value, exp = tile_tables(fmt)
    codes = np.arange(256) % (1 << formats.CODE_BITS[fmt])
    want = np.where(formats.nonfinite_codes(fmt)[codes], 0.0, np.nan_to_num(formats.values(fmt)[codes]))
    assert np.array_equal(value, want.astype(np.float32))
    present = want != 0
    assert np.array_equal(exp[present], formats.exponents(fmt)[codes][present])
    assert (exp[~present] == TILE_ABSENT_EXP).all()


@pytest.mark.parametrize("preset,fmt,block,scale_fmt", [("tcgen05_mxf8f6f4", "e4m3", 32, "ue8m0"),
                                                        ("tcgen05_mxf4nvf4", "e2m1", 16, "ue4m3")])
def test_a_prepared_b_gives_the_bits_of_the_reference(preset, fmt, block, scale_fmt):
    """B prepared once (panels and scales in the tile layout, the rows holding NaN/Inf or a NaN scale) serves
    several A with the reference's bits, including outputs handed over to the reference chain; a prepared B of
    another shape is refused."""
    from mmaemu.cpu.block_scaled import prepare_block_scaled_b

    M, N, K = 7, 150, 256
    a, b, sa, sb = _operands(fmt, fmt, M, N, K, block, scale_fmt, 61)
    prepared = prepare_block_scaled_b(b, fmt, sb, scale_fmt, block)
    assert prepared.bad.any() and not prepared.bad.all()
    for seed in (62, 63):
        a, _, sa, _ = _operands(fmt, fmt, M, N, K, block, scale_fmt, seed)
        want = accumulate_block_scaled(a, b, fmt, fmt, sa, sb, scale_fmt, _preset(preset), reference=True)
        got = accumulate_block_scaled(a, b, fmt, fmt, sa, sb, scale_fmt, _preset(preset), prepared_b=prepared)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="prepared_b was prepared"):
        accumulate_block_scaled(a, b[:-1], fmt, fmt, sa, sb[:-1], scale_fmt, _preset(preset), prepared_b=prepared)


def test_a_kept_weight_is_served_only_for_the_same_codes_and_scales():
    """scaled_mm on the block-scaled profile keeps a repeated mat2's preparation (mmaemu.cpu.prepared.WEIGHTS) and
    gives the reference's bits from it; a changed scale_b with the same mat2 is prepared anew, never served stale."""
    from mmaemu.block_quantize import quantize_mx
    from mmaemu.cpu.prepared import WEIGHTS
    from mmaemu.scale_layout import to_blocked

    torch.manual_seed(3)
    w = quantize_mx(torch.randn(192, 128), "e4m3")
    x = quantize_mx(torch.randn(3, 128), "e4m3", swizzle=True)
    weight = w.codes
    scale_w = to_blocked(w.scales)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")

        def call(scale_b, backend="auto"):
            return mmaemu.scaled_mm(x.codes, weight.t(), x.scales, scale_b, out_dtype=torch.float32,
                                    profile="b200-mx-experimental", splitk=1, backend=backend)

        want = call(scale_w, "reference")
        WEIGHTS.clear()
        for _ in range(3):
            assert torch.equal(call(scale_w).view(torch.int32), want.view(torch.int32))
        assert WEIGHTS.prepares == 1
        other = scale_w.view(torch.uint8).clone()
        other[:8] = other[:8] + 1
        other = other.view(scale_w.dtype)
        want_other = call(other, "reference")
        assert not torch.equal(want_other, want)
        for _ in range(2):
            assert torch.equal(call(other).view(torch.int32), want_other.view(torch.int32))
    WEIGHTS.clear()


def _fast_alone(a, b, fmt_a, fmt_b, sa, sb, scale_fmt, preset_name):
    """(fast path's outputs, the outputs it handed over) and the reference's outputs, both uint32 bits."""
    gemm = BlockScaledGemm(a, b, fmt_a, fmt_b, sa, sb, scale_fmt, _preset(preset_name))
    fast = np.zeros(gemm.shape[:2], np.float32)
    handed_over = _run_fast_blocks(gemm, fast)
    ref = accumulate_block_scaled(a, b, fmt_a, fmt_b, sa, sb, scale_fmt, gemm.preset, reference=True)
    return fast.view(np.uint32), handed_over, ref.view(np.uint32)


@pytest.mark.parametrize("M", [4, 6])
def test_the_int8_exponent_maxima_keep_the_extreme_exponent_sums(M):
    """The scaled-block tiles take the products' exponent maxima in int8 (SCALED_ABSENT_EXP): a block whose only
    nonzero products are subnormal x subnormal e5m2 (unscaled sum -28) beside elements paired with zeros (an
    absent factor: sums up to -49), blocks of the largest codes (sum 30), all-absent blocks, and the scale
    extremes (the largest on a block of absent sums after a nonzero accumulator: counted as a product, it would
    raise E and truncate c), in whole tiles of four rows and in a tile of two; the fast path covers them all and
    equals the reference."""
    rng = np.random.default_rng(29)
    N, K = 70, 160
    finite = np.flatnonzero(~formats.nonfinite_codes("e5m2"))
    a = rng.choice(finite, (M, K)).astype(np.uint8)
    b = rng.choice(finite, (N, K)).astype(np.uint8)
    sub = np.array([0x01, 0x02, 0x03, 0x81, 0x82, 0x83], np.uint8)  # e5m2 subnormals, both signs
    big = np.array([0x7B, 0xFB, 0x7A, 0xFA], np.uint8)  # the largest finite e5m2 codes (exponent 15)
    # block 0: subnormal x subnormal at even k, each nonzero element at odd k paired with a zero
    a[:, 0:32:2], b[:, 0:32:2] = rng.choice(sub, (M, 16)), rng.choice(sub, (N, 16))
    a[:, 1:32:2], b[:, 1:32:2] = rng.choice(big, (M, 16)), 0
    b[::3, 1:32:2] = rng.choice(big, (len(range(0, N, 3)), 16))  # some lanes: big x big beside the subnormals
    a[1::2, 33:64:2] = 0  # block 1: half of A's elements zero in some rows
    a[:, 64:96], b[:, 64:96] = rng.choice(big, (M, 32)), rng.choice(big, (N, 32))  # block 2: sums of 30
    a[:, 96:128] = 0  # block 3: no product (only absent sums), after a nonzero c; block 4 random
    sa = rng.integers(100, 155, (M, K // 32)).astype(np.uint8)
    sb = rng.integers(100, 155, (N, K // 32)).astype(np.uint8)
    sa[0, 0], sb[:5, 0] = 0, 0  # the smallest scale 2**-127 on the subnormal block
    sa[1, 2], sb[5:9, 2] = 254, 200  # large scales on the block of largest codes
    sa[:, 3], sb[:, 3] = 254, 254  # the largest scales on the block of absent sums: they must not raise E
    fast, handed_over, ref = _fast_alone(a, b, "e5m2", "e5m2", sa, sb, "ue8m0", "tcgen05_mxf8f6f4")
    assert not np.delete(handed_over, 1, axis=0).any()  # only row 1 (scale 2**127) reaches 2**128
    assert np.array_equal(fast[~handed_over], ref[~handed_over])
    b_zero = b.copy()
    b_zero[:, 0:32:2] = 0  # block 0 now has no nonzero product at all: only absent sums
    fast, handed_over, ref = _fast_alone(a, b_zero, "e5m2", "e5m2", sa, sb, "ue8m0", "tcgen05_mxf8f6f4")
    assert np.array_equal(fast[~handed_over], ref[~handed_over])


@pytest.mark.parametrize("M", [4, 7])
def test_a_group_of_zero_products_without_a_zero_operand_group_takes_no_part(M):
    """kind::mxf4nvf4: a group takes part in the alignment only where one of its products is nonzero (the tiles
    read it off the nonzero masks of A's row and B's lane, GroupMasks): groups whose A and B elements are nonzero
    at disjoint positions (every product 0, neither group zero) with large scales must not raise E; beside them
    groups sharing a single position, zero UE4M3 scales, and a negative zero element. The fast path covers every
    output and equals the reference."""
    rng = np.random.default_rng(31)
    N, K, block = 40, 128, 16
    a = rng.integers(1, 16, (M, K)).astype(np.uint8)
    b = rng.integers(1, 16, (N, K)).astype(np.uint8)
    a[:, 0:16:2], b[:, 1:16:2] = 0, 0  # group 0: A nonzero at odd k, B at even k only
    a[:, 16:32], b[:, 16:32] = 0, 0
    a[:, 16 + 5], b[:, 16 + 5] = 7, 0x8 | 3  # group 1: one shared position, one nonzero product
    a[:, 16 + 6], b[::2, 16 + 7] = 0x8, 6  # ... and -0 in A, a nonzero B beside it
    a[1:, 32:48] = 0x8  # group 2: negative zeros in A (rows 1..)
    sa = rng.integers(0x30, 0x50, (M, K // block)).astype(np.uint8)
    sb = rng.integers(0x30, 0x50, (N, K // block)).astype(np.uint8)
    sa[:, 0], sb[:, 0] = 0x7E, 0x7E  # the largest scales on the group of zero products: it must not set E,
    sa[:, 1:4], sb[:, 1:4] = rng.integers(1, 8, (M, 3)), rng.integers(1, 8, (N, 3))  # else these would truncate
    sa[0, 5], sb[::4, 5] = 0, 0  # zero scales
    fast, handed_over, ref = _fast_alone(a, b, "e2m1", "e2m1", sa, sb, "ue4m3", "tcgen05_mxf4nvf4")
    assert not handed_over.any()
    assert np.array_equal(fast, ref)


def _edge_scales(rng, rows, blocks, kind):
    """UE8M0 scale codes [rows, blocks] of one accumulator range: "top" (products times 2**86 .. 2**116: chains
    near and past 2**128), "subnormal" (2**-164 .. 2**-114: results in fp32's subnormal range and below its
    smallest step), "mixed" (both, per block)."""
    if kind == "top":
        return rng.integers(170, 186, (rows, blocks)).astype(np.uint8)
    if kind == "subnormal":
        return rng.integers(45, 71, (rows, blocks)).astype(np.uint8)
    return np.where(rng.random((rows, blocks)) < 0.5, rng.integers(170, 186, (rows, blocks)),
                    rng.integers(45, 71, (rows, blocks))).astype(np.uint8)


def _cancelling(rng, a, b):
    """Rows of A and lanes of B whose block 1 is block 0 negated (one or two nonzero products, exactly summed): the
    chain cancels to zero after block 1, then goes on from +0."""
    for m in range(0, a.shape[0], 2):
        a[m, 0:64] = 0
        pos = rng.choice(32, 2, replace=False)
        a[m, pos] = a[m, 32 + pos] = rng.integers(0x08, 0x70, 2)
        if m % 4 == 0:
            a[m, 64:] = 0  # ... and stays +0
    b[::2, 32:64] = b[::2, 0:32] ^ np.uint8(0x80)  # the sign bit of each element


@pytest.mark.parametrize("kind", ["top", "subnormal", "mixed"])
@pytest.mark.parametrize("preset,fmt_a,fmt_b", [("tcgen05_mxf8f6f4", "e4m3", "e4m3"),
                                                ("tcgen05_mxf8f6f4", "e5m2", "e2m1"),
                                                ("sm120_mxf8f6f4", "e4m3", "e5m2"),
                                                ("tcgen05_mxf4nvf4", "e2m1", "e2m1")])
@pytest.mark.parametrize("M", [4, 5])
def test_accumulators_at_the_edges_of_fp32(kind, preset, fmt_a, fmt_b, M):
    """The scaled-block tiles keep each accumulator as its value (float64 holding an fp32 value) and truncate the
    block sum onto the result grid by clearing its float64 fraction bits: accumulators near 2**128 and beyond (the
    fast path hands over exactly the outputs whose reference result is infinite), results in fp32's subnormal
    range and below its smallest step (+0), chains that cancel to zero and go on (both signs), in whole tiles and
    a tile of one row; kind::mxf4nvf4 (its integer accumulator) on the same scales. Equal to the reference."""
    rng = np.random.default_rng(37)
    N, K = 68, 192
    block = 32
    finite_a = np.flatnonzero(~formats.nonfinite_codes(fmt_a))
    finite_b = np.flatnonzero(~formats.nonfinite_codes(fmt_b))
    a = rng.choice(finite_a, (M, K)).astype(np.uint8)
    b = rng.choice(finite_b, (N, K)).astype(np.uint8)
    cancelling = fmt_a == "e4m3"
    if cancelling:
        _cancelling(rng, a, b)
    sa = _edge_scales(rng, M, K // block, kind)
    sb = _edge_scales(rng, N, K // block, kind)
    sa[:, 1], sb[:, 1] = sa[:, 0], sb[:, 0]  # the cancelling block takes the scales of the block it negates
    fast, handed_over, ref = _fast_alone(a, b, fmt_a, fmt_b, sa, sb, "ue8m0", preset)
    infinite = (ref & np.uint32(0x7FFFFFFF)) == np.uint32(0x7F800000)
    assert np.array_equal(handed_over, infinite)
    assert np.array_equal(fast[~handed_over], ref[~handed_over])
    magnitude = ref & np.uint32(0x7FFFFFFF)
    if kind == "subnormal":
        assert (magnitude[~handed_over] < np.uint32(0x00800000)).any() and magnitude.any()  # subnormal results
    if cancelling:
        assert (ref == 0).any()  # the chains cancelled to +0
    whole = accumulate_block_scaled(a, b, fmt_a, fmt_b, sa, sb, "ue8m0", _preset(preset)).view(np.uint32)
    assert np.array_equal(whole, ref)


@pytest.mark.parametrize("preset,fmt", [("tcgen05_mxf8f6f4", "e4m3"), ("tcgen05_mxf4nvf4", "e2m1")])
def test_nonfinite_elements_and_scales_beside_edge_accumulators(preset, fmt):
    """NaN/Inf element codes and the NaN scale code beside accumulators near 2**128 and in the subnormal range:
    the outputs they reach are handed to the reference chain, the others stay on the fast path; the whole GEMM
    equals the reference bit for bit (canonical NaN)."""
    rng = np.random.default_rng(41)
    M, N, K, block = 6, 40, 128, 32
    a = rng.integers(0, 1 << formats.CODE_BITS[fmt], (M, K)).astype(np.uint8)
    b = rng.integers(0, 1 << formats.CODE_BITS[fmt], (N, K)).astype(np.uint8)
    nonfinite = np.flatnonzero(formats.nonfinite_codes(fmt))
    if nonfinite.size:
        a[1, 5], b[3, 70] = nonfinite[0], nonfinite[-1]
    sa = _edge_scales(rng, M, K // block, "mixed")
    sb = _edge_scales(rng, N, K // block, "mixed")
    sa[2, 3], sb[7, 0] = 0xFF, 0xFF  # NaN scales
    p = _preset(preset)
    fast = accumulate_block_scaled(a, b, fmt, fmt, sa, sb, "ue8m0", p).view(np.uint32)
    ref = accumulate_block_scaled(a, b, fmt, fmt, sa, sb, "ue8m0", p, reference=True).view(np.uint32)
    assert np.array_equal(fast, ref)
    assert (ref == 0x7FFFFFFF).any()

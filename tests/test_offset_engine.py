"""The CPU's offset engine (mmaemu.cpu.offset_engine on mmaemu.cpu.simd's vector intrinsics: AVX-512 embedded
rounding, or AVX2 with MXCSR rounding) equals the reference engine and the tile engine bit for bit; every vector
intrinsic equals its exact twin; every constant of the block step matters; the engine is chosen from the CPU Numba
compiles for, never compiled without AVX-512 or AVX2 and FMA.

The input families are those of tests/test_fast_path.py (random, wide exponent spreads with subnormals, exact
cancellations) plus hand-built blocks (one huge product among tiny ones, subnormals only, grid-edge significands,
a growing accumulator), on shapes from (1, 1, 1) to (13, 200, 517) with K rarely a multiple of 16 or 32.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from mmaemu import environment
from mmaemu.context import Context
from mmaemu.arith.offset import ADD_MAX, OffsetConstants, offset_params
from mmaemu.arith.params import codes_gemm, preset_params
from mmaemu.cpu import features
from mmaemu.cpu.engine import accumulate_codes, cpu_engine_choice
from mmaemu.cpu.features import offset_call_decline
from mmaemu.cpu.offset_engine import accumulate_prepared, prepare_b
from mmaemu.cpu.selftest import adversarial_rows  # the self-test's families (one huge product among tiny ones...)
from mmaemu.model.presets import ADA, B200_MMA_SYNC, HOPPER, Preset

from test_fast_path import CODE_FAMILIES, PAIRS, cancelling_codes, family_codes, random_codes, spread_codes

OFFSET_RUNS = features.offset_engine_decline(features.numba_target()) is None
needs_offset = pytest.mark.skipif(not OFFSET_RUNS, reason="the target CPU has neither AVX-512 F/BW/DQ/VL nor AVX2 "
                                                          "and FMA")


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def _engines_agree(a, b, fmt_a, fmt_b, preset, fast, splits=1, scheme="none"):
    ref = accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, splits, scheme, reference=True)
    tile = accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, splits, scheme, cpu_engine="tile")
    got = accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, splits, scheme, cpu_engine="offset")
    assert np.array_equal(_bits(ref), _bits(tile))
    bad = np.argwhere(_bits(ref) != _bits(got))
    assert not len(bad), (f"{len(bad)} outputs differ ({preset.name} {fmt_a}x{fmt_b} fast={fast} S={splits} "
                          f"{scheme}, shape {a.shape} x {b.shape}); first at {tuple(bad[0])}")


@needs_offset
@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS)
def test_random_families_and_shapes(fmt_a, fmt_b):
    rng = np.random.default_rng(abs(hash((fmt_a, fmt_b))) % 2**32)
    shapes = [(1, 1, 1), (2, 64, 16), (3, 65, 33), (5, 17, 100), (13, 200, 517), (4, 130, 257)]
    for (M, N, K), (preset, fast) in zip(shapes, [(HOPPER, True), (ADA, False), (HOPPER, False), (ADA, True),
                                                   (HOPPER, True), (ADA, True)]):
        for family in range(len(CODE_FAMILIES)):
            _engines_agree(*family_codes(rng, family, fmt_a, fmt_b, M, N, K), fmt_a, fmt_b, preset, fast)


@needs_offset
@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS)
def test_adversarial_blocks_and_schedules(fmt_a, fmt_b):
    rng = np.random.default_rng(7)
    K = 300
    a = adversarial_rows(fmt_a, K)
    b = np.concatenate([adversarial_rows(fmt_b, K), random_codes(rng, fmt_b, (60, K))])
    for preset in (HOPPER, ADA):
        for fast in (True, False):
            for k in (K, 33, 129):
                _engines_agree(np.ascontiguousarray(a[:, :k]), np.ascontiguousarray(b[:, :k]), fmt_a, fmt_b,
                               preset, fast)
    _engines_agree(a, b, fmt_a, fmt_b, HOPPER, True, 3, "contiguous")
    _engines_agree(a, b, fmt_a, fmt_b, HOPPER, False, 5, "contiguous")
    _engines_agree(a, b, fmt_a, fmt_b, ADA, False, 5, "pairwise")
    _engines_agree(a, b, fmt_a, fmt_b, ADA, True, 24, "serial")  # splits made of padding tiles only


def _finite(fmt):
    """(values float64[256], the finite codes (+0 and -0 included), the nonzero finite codes) of a format."""
    from mmaemu import formats

    values = np.asarray(formats.values(fmt), np.float64)
    finite = np.flatnonzero(np.isfinite(values)).astype(np.uint8)
    return values, finite, finite[values[finite] != 0]


def _nearest(fmt, x):
    """The finite codes nearest to the values x (ties to the lower), +0 for 0."""
    values, finite, _ = _finite(fmt)
    order = finite[np.argsort(values[finite], kind="stable")]
    sorted_values = values[order]
    i = np.clip(np.searchsorted(sorted_values, x), 1, len(order) - 1)
    lower = (x - sorted_values[i - 1]) <= (sorted_values[i] - x)
    codes = order[i - lower]
    return np.where(x == 0, np.uint8(0), codes).astype(np.uint8)


def _prototype_family(kind, rng, fmt, shape, negative=False):
    """One operand of the offset prototype's input families (its check_exact.py), for any FP8 format:
    ``uniform`` every finite code equally likely (+0 and -0 too); ``wide`` log-uniform magnitudes over the whole
    range, random signs, a tenth zeros; ``block_peak`` one largest-magnitude term at the start of every 32 k among
    tiny ones (every block's products all truncated but one: the counts decide); ``positive`` (or, ``negative``,
    negative) magnitudes of a few binades, so that all products have one sign; ``growing`` large terms in the
    first half of K, small ones of both signs after (the accumulator dominates the block exponents); ``subnormal``
    subnormal and smallest normal codes only, both signs; ``grid`` significands 1.0, the next one up and the
    largest (powers of two and odd significands: products on the grid's edge)."""
    from mmaemu import formats

    values, finite, nonzero = _finite(fmt)
    mbits = formats.MANT_BITS[fmt]
    largest, smallest = np.abs(values[finite]).max(), np.abs(values[nonzero]).min()
    rows, K = shape
    if kind == "uniform":
        return rng.choice(finite, shape)
    if kind == "wide":
        x = np.exp2(rng.uniform(np.log2(smallest), np.log2(largest), shape)) * rng.choice([-1, 1], shape)
        x[rng.random(shape) < 0.1] = 0
        return _nearest(fmt, x)
    if kind == "block_peak":
        codes = _nearest(fmt, rng.standard_normal(shape) * smallest * 4)
        codes[:, ::32] = _nearest(fmt, largest * rng.choice([-1.0, 1.0], (rows, len(range(0, K, 32)))))
        return codes
    if kind == "positive":
        x = np.abs(rng.standard_normal(shape)) * 4 + smallest
        return _nearest(fmt, -x if negative else x)
    if kind == "growing":
        codes = _nearest(fmt, np.abs(rng.standard_normal(shape)) * largest / 8 + 1)
        codes[:, K // 2:] = _nearest(fmt, rng.standard_normal((rows, K - K // 2)) * 0.05)
        return codes
    if kind == "subnormal":
        small = nonzero[np.abs(values[nonzero]) <= 2.0 ** formats.EMIN[fmt]]
        return rng.choice(small, shape)
    if kind == "grid":
        low_bits = nonzero & ((1 << mbits) - 1)
        edge = nonzero[(low_bits == 0) | (low_bits == 1) | (low_bits == (1 << mbits) - 1)]
        return rng.choice(edge, shape)
    raise ValueError(kind)


PROTOTYPE_FAMILIES = ("uniform", "wide", "block_peak", "positive", "growing", "subnormal", "grid")


@needs_offset
@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS)
def test_prototype_families(fmt_a, fmt_b):
    """The offset prototype's input families (:func:`_prototype_family`) on its awkward shapes (one output, partial
    tiles and panels, K past one block and across several), the offset engine against the reference; the
    ``positive`` family with B negated gives products of one sign only."""
    rng = np.random.default_rng(abs(hash(("prototype", fmt_a, fmt_b))) % 2**32)
    shapes = [(1, 1, 1), (3, 5, 7), (5, 70, 33), (9, 130, 100), (8, 64, 1920), (33, 65, 95)]
    for kind in PROTOTYPE_FAMILIES:
        for (M, N, K), (preset, fast) in zip(shapes, [(HOPPER, True), (ADA, False), (HOPPER, True), (ADA, True),
                                                       (HOPPER, True), (HOPPER, False)]):
            a = _prototype_family(kind, rng, fmt_a, (M, K))
            b = _prototype_family(kind, rng, fmt_b, (N, K), negative=True)
            _engines_agree(a, b, fmt_a, fmt_b, preset, fast)


def test_prototype_families_are_what_they_say():
    """The families' defining properties (so that a family cannot silently turn into random codes)."""
    from mmaemu import formats

    rng = np.random.default_rng(3)
    for fmt in ("e4m3", "e5m2"):
        values = np.asarray(formats.values(fmt), np.float64)
        shape = (6, 256)
        assert np.all(np.isfinite(values[_prototype_family("uniform", rng, fmt, shape)]))
        peak = values[_prototype_family("block_peak", rng, fmt, shape)]
        assert np.all(np.abs(peak[:, ::32]) == np.nanmax(np.abs(values[np.isfinite(values)])))
        assert np.all(np.abs(np.delete(peak, np.s_[::32], axis=1)) < 1)
        assert np.all(values[_prototype_family("positive", rng, fmt, shape)] > 0)
        assert np.all(values[_prototype_family("positive", rng, fmt, shape, negative=True)] < 0)
        sub = np.abs(values[_prototype_family("subnormal", rng, fmt, shape)])
        assert np.all((sub > 0) & (sub <= 2.0 ** formats.EMIN[fmt]))
        wide = values[_prototype_family("wide", rng, fmt, shape)]
        assert (wide == 0).any() and (wide < 0).any() and np.abs(wide).max() / np.abs(wide[wide != 0]).min() > 2**12


@needs_offset
def test_nonfinite_codes_follow_c4():
    rng = np.random.default_rng(9)
    a, b = random_codes(rng, "e4m3", (5, 97)), random_codes(rng, "e5m2", (40, 97))
    a[1, 5], b[7, 0], b[20, 50] = 0x7F, 0x7C, 0xFE
    _engines_agree(a, b, "e4m3", "e5m2", HOPPER, True)
    _engines_agree(a, b, "e4m3", "e5m2", ADA, False, 4, "pairwise")


@needs_offset
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_packed_layout_is_offset_packs(fmt):
    """B's panels and A's tile-major words hold exactly the values, low-byte and sign-byte words of
    mmaemu.arith.offset.offset_pack_rows (the CUDA kernel's packing) and the exponent bytes of
    mmaemu.arith.offset.exponent_bytes (A's four times in a word), ragged rows and K included (zero codes past
    them)."""
    from mmaemu.arith.offset import exponent_bytes, offset_pack_rows, offset_tables
    from mmaemu.cpu.offset_engine import pack_a
    from mmaemu.cpu.offset_kernel import (PANEL, ROWS, TILE_EXPONENTS, TILE_LOWS, TILE_SIGNS, TILE_VALUES,
                                          TILE_WORDS, padded_k)

    rng = np.random.default_rng(2)
    for rows, K in ((1, 1), (3, 17), (65, 70), (130, 33)):
        codes = rng.integers(0, 256, (rows, K), dtype=np.uint8)
        kp, columns = padded_k(K), -(-rows // PANEL) * PANEL
        val, exp = np.zeros((kp, columns), np.float32), np.zeros((kp // 2, columns), np.uint32)
        words = np.zeros((kp // 4, 2 * columns), np.uint32)
        offset_pack_rows(codes, offset_tables(fmt, ADD_MAX), val, exp, words, False)
        padded = np.zeros((columns, kp), np.uint8)
        padded[:rows, :K] = codes
        exp_bytes = exponent_bytes(fmt)[padded.T]  # [kp, columns]
        prepared = prepare_b(codes, fmt)
        for p in range(columns // PANEL):
            part = slice(p * PANEL, (p + 1) * PANEL)
            assert np.array_equal(prepared.val[p].view(np.uint32), val[:, part].view(np.uint32))
            assert prepared.exp.dtype == np.int8 and np.array_equal(prepared.exp[p], exp_bytes[:, part])
            assert np.array_equal(prepared.low[p], words[:, 0::2][:, part])
            assert np.array_equal(prepared.sign[p], words[:, 1::2][:, part])
        packed = pack_a(codes, fmt)
        tiles = -(-rows // ROWS)
        assert packed.dtype == np.uint32 and packed.shape == (tiles * (kp // 4), TILE_WORDS)
        words_of = packed.reshape(tiles, kp // 4, TILE_WORDS)

        def field(start, per_group):  # [tiles * ROWS, kp // 4 * per_group]: row-major like offset_pack_rows
            part = words_of[:, :, start:start + per_group * ROWS].reshape(tiles, kp // 4, per_group, ROWS)
            return part.transpose(0, 3, 1, 2).reshape(tiles * ROWS, kp // 4 * per_group)

        used = tiles * ROWS
        assert np.array_equal(field(TILE_VALUES, 4), val[:, :used].T.view(np.uint32))
        replicated = exp_bytes[:, :used].T.view(np.uint8).astype(np.uint32) * np.uint32(0x01010101)
        assert np.array_equal(field(TILE_EXPONENTS, 4), replicated)
        assert np.array_equal(field(TILE_LOWS, 1), words[:, 0::2][:, :used].T)
        assert np.array_equal(field(TILE_SIGNS, 1), words[:, 1::2][:, :used].T)


@needs_offset
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_panel_decode_is_checked_against_the_tables(fmt, monkeypatch):
    """code_decode runs the engine's own panel decode (pack_panel) on every code at every byte position of a 4-k
    word and compares it with the tables: it accepts the format, and one entry of any table altered (a value's
    last bit, an exponent, a low or a sign byte of one code) makes it raise."""
    from mmaemu.cpu import offset_engine

    codes = offset_engine.every_code_panel()
    for i in range(4):
        assert sorted(codes[:, i::4].ravel()) == list(range(256))
    monkeypatch.setattr(offset_engine, "_DECODES", {})
    assert offset_engine.code_decode(fmt).mant_bits == (3 if fmt == "e4m3" else 2)
    tables = offset_engine.packing_tables(fmt)
    code = 0xB3  # a negative normal code of both formats
    for field in range(4):
        altered = [t.copy() for t in tables]
        if field == 0:
            altered[0][code] = np.nextafter(altered[0][code], np.float32(0))
        else:
            altered[field][code] ^= 1 if field < 3 else 0x80
        monkeypatch.setattr(offset_engine, "_DECODES", {})
        monkeypatch.setitem(offset_engine._TABLES, fmt, tuple(altered))
        with pytest.raises(ValueError, match="differs from its tables"):
            offset_engine.code_decode(fmt)


@needs_offset
def test_prepared_b_is_reused_and_read_only():
    rng = np.random.default_rng(1)
    a1, a2 = random_codes(rng, "e4m3", (3, 70)), random_codes(rng, "e5m2", (4, 70))
    b = random_codes(rng, "e4m3", (33, 70))
    kept = b.copy()
    prepared = prepare_b(b, "e4m3")
    b[:] = 0  # the prepared panels hold no reference to B's storage
    assert not prepared.val.flags.writeable and prepared.nbytes == prepared.val.size * 7 + 33
    assert not prepared.nonfinite.flags.writeable  # B's row flags, kept with the panels
    with_nan = kept.copy()
    with_nan[[2, 30], [5, 69]] = 0x7F  # E4M3's NaN code in rows 2 and 30
    assert prepare_b(with_nan, "e4m3").nonfinite.tolist() == [n in (2, 30) for n in range(33)]
    for a, fmt_a in ((a1, "e4m3"), (a2, "e5m2")):
        gemm = codes_gemm(a, kept, fmt_a, "e4m3", HOPPER, True)
        out = np.zeros((a.shape[0], 33), np.float32)
        accumulate_prepared(gemm.a_codes, prepared, fmt_a, HOPPER, gemm.schedule, out)
        want = accumulate_codes(a, kept, fmt_a, "e4m3", HOPPER, True, reference=True)
        assert np.array_equal(_bits(out), _bits(want))
    with pytest.raises(ValueError, match="K=70"):
        accumulate_prepared(np.zeros((1, 71), np.uint8), prepared, "e4m3", HOPPER, (71, 1, 0, 0, 0, 0),
                            np.zeros((1, 33), np.float32))


# ----------------------------------------------------------------------------------------------------------------
# Every constant of the block step matters: each altered constant is caught by the families above
# ----------------------------------------------------------------------------------------------------------------

MIN_EXP_0 = Preset("offset-minexp0", nfma=32, frac=13, frac_out=13, min_exp=0, late_c=False, slow_chunk=128)
# start: power sums only; p_add: the add-max pass's bias, which the CPU engine's byte exponent pass does not read
# (its own bias, BitMasks.exponent_bias, is altered by test_every_mask_matters)
CONSTANT_NAMES = tuple(name for name in OffsetConstants._fields if name not in ("start", "p_add"))


def _mutation_operands():
    rng = np.random.default_rng(21)
    K = 160
    a = np.concatenate([adversarial_rows("e4m3", K), spread_codes(rng, "e4m3", (4, K)),
                        cancelling_codes(rng, "e4m3", "e4m3", 4, 1, K)[0], random_codes(rng, "e4m3", (3, K))])
    b = np.concatenate([adversarial_rows("e4m3", K), spread_codes(rng, "e4m3", (20, K)),
                        random_codes(rng, "e4m3", (30, K)), cancelling_codes(rng, "e4m3", "e4m3", 1, 7, K)[1]])
    return a, b


# (constant, signed step): one unit of the constant's own scale (a count, an exponent step of 2**23 in a pattern, a
# byte of the threshold word), both ways. tau_max, the upper clamp of the threshold's shift (R + 1 = 35 for E4M3 x
# E4M3), is moved down only: it guards condition 4 for shifts above R, which the shipped presets' products and
# accumulators cannot reach (E - frac - lo <= 23 here), so a clamp raised, or lowered by one, is never read; a clamp
# of 19 is read by every block whose shift exceeds it.
MUTATIONS = [(name, delta) for name in CONSTANT_NAMES if name != "tau_max" for delta in (-1, 1)] + [("tau_max", -16)]


@needs_offset
@pytest.mark.parametrize("name,delta", MUTATIONS, ids=[f"{n}{d:+d}" for n, d in MUTATIONS])
def test_every_constant_matters(name, delta):
    """Each constant of offset_params moved (MUTATIONS) changes some output of the adversarial families (runtime
    values: nothing is recompiled), and the unchanged constants give the reference's bits."""
    a, b = _mutation_operands()
    # The floor 2**e_floor decides E only where min_exp lies above every product's exponent sum (with min_exp
    # below lo it changes nothing: condition 2), so it is moved on a preset whose min_exp is 0.
    preset = MIN_EXP_0 if name == "floor_bits" else HOPPER
    gemm = codes_gemm(a, b, "e4m3", "e4m3", preset, True)
    want = accumulate_codes(a, b, "e4m3", "e4m3", preset, True, reference=True)
    constants = list(offset_params(preset_params(preset, "e4m3", "e4m3"), "e4m3", "e4m3", ADD_MAX))
    i = OffsetConstants._fields.index(name)
    step = {"p_add": 1 << 23, "floor_bits": 1 << 23, "m_add": 1 << 23, "top4": 1, "mantissa": 1 << 21}.get(name, 1)
    if name == "nfma":
        step = 16  # blocks are read as whole passes of 16 k
    constants[i] = int(np.array((constants[i] + delta * step) % 2**32, np.uint32).view(np.int32))
    prepared = prepare_b(gemm.b_codes, "e4m3")
    out = np.zeros(gemm.shape[:2], np.float32)
    accumulate_prepared(gemm.a_codes, prepared, "e4m3", preset, gemm.schedule, out, OffsetConstants(*constants))
    assert not np.array_equal(_bits(out), _bits(want)), f"{name} {delta:+d} went unnoticed"
    constants[i] = offset_params(preset_params(preset, "e4m3", "e4m3"), "e4m3", "e4m3", ADD_MAX)[i]
    accumulate_prepared(gemm.a_codes, prepared, "e4m3", preset, gemm.schedule, out, OffsetConstants(*constants))
    assert np.array_equal(_bits(out), _bits(want))


def _mutated_call(preset=HOPPER, constants=None, masks=None):
    """The adversarial families through accumulate_prepared with altered constants or masks, and the reference."""
    from mmaemu.cpu.offset_kernel import MASKS

    a, b = _mutation_operands()
    gemm = codes_gemm(a, b, "e4m3", "e4m3", preset, True)
    want = accumulate_codes(a, b, "e4m3", "e4m3", preset, True, reference=True)
    out = np.zeros(gemm.shape[:2], np.float32)
    accumulate_prepared(gemm.a_codes, prepare_b(gemm.b_codes, "e4m3"), "e4m3", preset, gemm.schedule, out,
                        constants, MASKS if masks is None else masks)
    return _bits(out), _bits(want)


# (index in MASKS, altered value): the byte sum without its top byte, no sign on M, the exponent field without its
# lowest bit, the byte exponent pass's bias one exponent step either way.
MASK_MUTATIONS = [(0, 0x00010101), (1, 0), (2, -0x01000000), (3, (127 - 1) << 23), (3, (127 + 1) << 23)]


@needs_offset
@pytest.mark.parametrize("index,value", MASK_MUTATIONS, ids=["byte_sum", "sign", "exponent_field",
                                                       "exponent_bias-1", "exponent_bias+1"])
def test_every_mask_matters(index, value):
    from mmaemu.cpu.offset_kernel import MASKS

    masks = list(MASKS)
    masks[index] = value
    got, want = _mutated_call(masks=type(MASKS)(*masks))
    assert not np.array_equal(got, want)


# (table, what is altered): zero codes' low byte at 0 (a zero term next to a negative one then counts), the sign
# byte at 0x40 (bit 7 never set: no correction), zero codes' exponent byte as a real one (absent terms then set E),
# every real low byte one higher.
TABLE_MUTATIONS = ["zero_low", "sign_byte", "exp_absent", "low_bytes"]


@needs_offset
@pytest.mark.parametrize("mutation", TABLE_MUTATIONS)
def test_every_table_constant_matters(mutation, monkeypatch):
    from mmaemu.arith import offset
    from mmaemu.cpu import offset_engine

    values, _, lows, signs = (t.copy() for t in offset.offset_tables("e4m3", ADD_MAX))
    exps = offset.exponent_bytes("e4m3").copy()
    zero = values == 0
    if mutation == "zero_low":
        lows[zero] = 0
    elif mutation == "sign_byte":
        signs[signs == offset.SIGN_BYTE] = 0x40
    elif mutation == "exp_absent":
        exps[zero] = 8
    else:
        lows[~zero] += 1
    monkeypatch.setitem(offset_engine._TABLES, "e4m3", (values, exps, lows, signs))
    got, want = _mutated_call()
    assert not np.array_equal(got, want)


# ----------------------------------------------------------------------------------------------------------------
# The choice of the engine
# ----------------------------------------------------------------------------------------------------------------

ZEN4 = features.TargetCpu("znver4", frozenset(features.REQUIRED_FEATURES + ("avx2",)), "x86_64")
GENERIC = features.TargetCpu("generic", frozenset(), "x86_64")
HASWELL = features.TargetCpu("haswell", frozenset({"avx2", "fma"}), "x86_64")


AVX_NO_FMA = features.TargetCpu("custom", frozenset({"avx", "avx2"}), "x86_64")


def test_choice_from_the_target_cpu():
    assert features.choose_cpu_engine("auto", ZEN4, None).engine == "offset"
    assert "AVX-512" in features.choose_cpu_engine("auto", ZEN4, None).reason
    assert features.offset_rounding(ZEN4) == features.ROUNDING_EMBEDDED
    choice = features.choose_cpu_engine("auto", HASWELL, None)
    assert choice.engine == "offset" and "MXCSR" in choice.reason
    assert features.offset_rounding(HASWELL) == features.ROUNDING_MXCSR
    assert features.choose_cpu_engine("offset", HASWELL, None).engine == "offset"
    for target in (GENERIC, AVX_NO_FMA, features.TargetCpu("apple-m1", frozenset({"avx2", "fma"}), "arm64")):
        assert features.offset_rounding(target) is None
        choice = features.choose_cpu_engine("auto", target, None)
        assert choice.engine == "tile" and ("AVX2 and FMA" in choice.reason or "x86-64" in choice.reason)
        with pytest.raises(ValueError, match="MMAEMU_CPU_ENGINE=offset.*unset MMAEMU_CPU_ENGINE"):
            features.choose_cpu_engine("offset", target, None)
    assert features.choose_cpu_engine("tile", ZEN4, None) == ("tile", "MMAEMU_CPU_ENGINE=tile", ())
    assert features.choose_cpu_engine("auto", ZEN4, "needs x").engine == "tile"
    with pytest.raises(ValueError, match="needs x"):
        features.choose_cpu_engine("offset", ZEN4, "needs x")


def test_auto_takes_the_offset_engine_where_it_is_the_faster_one():
    """A speed rule of "auto" only (docs/performance.md): forcing the offset engine ignores it, and both engines
    give the same bits whatever the shape (the tests above)."""
    for rounding, shapes in features.OFFSET_SHAPES.items():
        lo, hi, n, narrow = shapes
        cases = [(lo, n, True), (lo, 5760, True), (lo - 1, 5760, False), (1, 5760, False), (lo, n - 1, False)]
        if narrow is None:
            cases += [(64, n - 1, False), (16, 16, False)]
        else:  # narrow results: from narrow rows on, whatever N
            cases += [(narrow, 1, True), (narrow, n - 1, True), (narrow - 1, n - 1, False)]
        cases += [(hi, 5760, True), (hi + 1, 5760, False)] if hi is not None else [(1 << 20, 5760, True)]
        for M, N, faster in cases:
            decline = features.offset_shape_decline(M, N, rounding)
            assert (decline is None) == faster, (rounding, M, N, decline)
            choice = features.choose_cpu_engine("auto", ZEN4, None, decline)
            assert choice.engine == ("offset" if faster else "tile"), (M, N, choice)
            assert features.choose_cpu_engine("offset", ZEN4, None, decline).engine == "offset"
    assert "M = 1, N = 5760" in features.choose_cpu_engine("auto", ZEN4, None,
                                                           features.offset_shape_decline(1, 5760)).reason
    schedule = (4096, 1, 0, 0, 0, 0)
    assert cpu_engine_choice(HOPPER, schedule, "e4m3", "e4m3", "auto", (1, 5760)).engine == "tile"
    assert cpu_engine_choice(HOPPER, schedule, "e4m3", "e4m3", "auto", (64, 5760)).engine == (
        "offset" if OFFSET_RUNS else "tile")


def test_feature_strings_as_llvm_writes_them():
    assert features.parse_features("+avx512f,-avx512fp16,+avx512bw, +sse2") == {"avx512f", "avx512bw", "sse2"}
    assert features.parse_features("") == frozenset()


def test_calls_the_method_fits():
    fast = (4096, 1, 0, 0, 0, 0)
    for preset in (HOPPER, ADA):
        for fmt_a, fmt_b in PAIRS:
            assert offset_call_decline(preset, fast, fmt_a, fmt_b) is None
            assert offset_call_decline(preset, (128, 1, 0, 1, 0, 0), fmt_a, fmt_b) is None
            assert offset_call_decline(preset, (64, 5, 1, 2, 1, 1), fmt_a, fmt_b) is None
    assert "late" in offset_call_decline(B200_MMA_SYNC, fast, "e4m3", "e4m3")
    assert "16" in offset_call_decline(Preset("c8", nfma=8, frac=13, frac_out=13, min_exp=-132, late_c=False,
                                              slow_chunk=128), fast, "e4m3", "e4m3")
    assert "frac_out" in offset_call_decline(Preset("c", nfma=16, frac=13, frac_out=10, min_exp=-132, late_c=False,
                                                    slow_chunk=128), fast, "e4m3", "e4m3")


def test_environment_variable():
    assert environment.snapshot({})["MMAEMU_CPU_ENGINE"] == "auto"
    assert environment.snapshot({"MMAEMU_CPU_ENGINE": " Tile "})["MMAEMU_CPU_ENGINE"] == "tile"
    env = environment.snapshot({"MMAEMU_CPU_ENGINE": "fast"})
    assert env["MMAEMU_CPU_ENGINE"] == "auto" and "MMAEMU_CPU_ENGINE" in env.invalid


def test_the_choice_follows_the_variable_of_its_context():
    schedule = (100, 1, 0, 0, 0, 0)
    tile, auto = (Context(environment.snapshot({"MMAEMU_CPU_ENGINE": name})) for name in ("tile", "auto"))
    assert cpu_engine_choice(HOPPER, schedule, "e4m3", "e4m3", context=tile).engine == "tile"
    assert cpu_engine_choice(B200_MMA_SYNC, schedule, "e4m3", "e4m3", context=auto).engine == "tile"
    assert cpu_engine_choice(HOPPER, schedule, "e4m3", "e4m3", context=auto).engine == (
        "offset" if OFFSET_RUNS else "tile")
    with pytest.raises(TypeError, match="requested engine or the context"):
        cpu_engine_choice(HOPPER, schedule, "e4m3", "e4m3")  # a decision reads no environment


def test_accumulate_codes_follows_the_variable_at_its_edge(monkeypatch):
    """accumulate_codes, a public entry point, takes the context of the moment when given none: forcing the
    offset engine where it cannot compute (a preset that adds c late) raises the choice's error; its own context
    overrides the environment."""
    rng = np.random.default_rng(3)
    a, b = random_codes(rng, "e4m3", (2, 64)), random_codes(rng, "e4m3", (3, 64))
    want = accumulate_codes(a, b, "e4m3", "e4m3", B200_MMA_SYNC, True, reference=True)
    monkeypatch.setenv("MMAEMU_CPU_ENGINE", "offset")
    with pytest.raises(ValueError, match="unset MMAEMU_CPU_ENGINE"):
        accumulate_codes(a, b, "e4m3", "e4m3", B200_MMA_SYNC, True)
    tile = Context(environment.snapshot({"MMAEMU_CPU_ENGINE": "tile"}))
    got = accumulate_codes(a, b, "e4m3", "e4m3", B200_MMA_SYNC, True, context=tile)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning")  # b200_mma_sync, the preset refused here
def test_explain_names_the_engine_that_runs(monkeypatch):
    """explain's cpu_engine is the choice of the call's own environment; a forced offset engine that cannot compute
    the call is the call's error (explain reports it, scaled_mm raises it before computing)."""
    import torch

    import mmaemu

    x, w = torch.zeros(16, 64, dtype=torch.float8_e4m3fn), torch.zeros(384, 64, dtype=torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    monkeypatch.setenv("MMAEMU_CPU_ENGINE", "tile")
    plan = mmaemu.explain(x, w.t(), one, one, out_dtype=torch.bfloat16, splitk=1)
    assert plan.backend == "cpu" and plan.cpu_engine == "tile: MMAEMU_CPU_ENGINE=tile"
    monkeypatch.setenv("MMAEMU_CPU_ENGINE", "auto")
    plan = mmaemu.explain(x, w.t(), one, one, out_dtype=torch.bfloat16, splitk=1)
    assert plan.cpu_engine.startswith("offset: " if OFFSET_RUNS else "tile: the offset engine needs")
    monkeypatch.setenv("MMAEMU_CPU_ENGINE", "offset")
    plan = mmaemu.explain(x, w.t(), one, one, out_dtype=torch.float32, splitk=1, use_fast_accum=True,
                          profile="b200-mma-sync-experimental")
    assert plan.validation[0] == "ValueError" and "unset MMAEMU_CPU_ENGINE" in plan.validation[1]
    with pytest.raises(ValueError, match="adds c late"):
        mmaemu.scaled_mm(x, w.t(), one, one, out_dtype=torch.float32, splitk=1, use_fast_accum=True,
                         profile="b200-mma-sync-experimental")


GENERIC_RUN = """
import sys
import numpy as np
from mmaemu.cpu.engine import accumulate_codes, cpu_engine_choice
from mmaemu.model.presets import HOPPER
a, b = (np.frombuffer(bytes.fromhex(text), np.uint8).reshape(rows, 40) for text, rows in zip(sys.argv[1:], (3, 5)))
choice = cpu_engine_choice(HOPPER, (40, 1, 0, 0, 0, 0), "e4m3", "e4m3", "auto")
got = accumulate_codes(a, b, "e4m3", "e4m3", HOPPER, True)
try:
    accumulate_codes(a, b, "e4m3", "e4m3", HOPPER, True, cpu_engine="offset")
    refused = "no"
except ValueError as exc:
    refused = str(exc)
print(choice.engine, "mmaemu.cpu.offset_kernel" in sys.modules, "unset MMAEMU_CPU_ENGINE" in refused,
      got.view(np.uint32).tobytes().hex())
"""


@pytest.mark.subprocess
@pytest.mark.slow
def test_generic_cpu_keeps_the_tile_engine_and_never_compiles_the_offset_one(tmp_path):
    """NUMBA_CPU_NAME=generic (Numba then enables no feature): the tile engine computes, the offset engine's module
    is never imported (so nothing of it is compiled), and forcing it raises the error that names the way out."""
    rng = np.random.default_rng(0)
    a, b = random_codes(rng, "e4m3", (3, 40)), random_codes(rng, "e4m3", (5, 40))
    want = accumulate_codes(a, b, "e4m3", "e4m3", HOPPER, True, reference=True)
    env = dict(os.environ, NUMBA_CPU_NAME="generic", MMAEMU_CACHE_DIR=str(tmp_path))
    env.pop("NUMBA_CPU_FEATURES", None)
    env.pop("MMAEMU_CPU_ENGINE", None)
    run = subprocess.run([sys.executable, "-c", GENERIC_RUN, a.tobytes().hex(), b.tobytes().hex()], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["tile", "False", "True", want.view(np.uint32).tobytes().hex()]


HASWELL_RUN = """
import sys
import numpy as np
from mmaemu.cpu import features
from mmaemu.cpu.engine import accumulate_codes, cpu_engine_choice
from mmaemu.cpu.simd import MXCSR_ROUNDING_FIELD, thread_mxcsr
from mmaemu.model.presets import ADA, HOPPER
a, b = (np.frombuffer(bytes.fromhex(text), np.uint8).reshape(rows, 300) for text, rows in zip(sys.argv[1:], (5, 70)))
print(features.offset_rounding(features.numba_target()),
      cpu_engine_choice(HOPPER, (300, 1, 0, 0, 0, 0), "e4m3", "e4m3", "offset").engine)
for preset, fast, splits, scheme in ((HOPPER, True, 1, "none"), (ADA, False, 3, "pairwise")):
    got = accumulate_codes(a, b, "e4m3", "e4m3", preset, fast, splits, scheme, cpu_engine="offset")
    print(got.view(np.uint32).tobytes().hex())
print(thread_mxcsr() & MXCSR_ROUNDING_FIELD)
"""


@pytest.mark.subprocess
@pytest.mark.slow
def test_an_avx2_target_rounds_by_mxcsr_with_the_same_bits(tmp_path):
    """NUMBA_CPU_NAME=haswell with AVX2 and FMA only (what Numba compiles for on an AVX-512 machine too): the offset
    engine rounds by MXCSR, gives the reference engine's bits for a fast and a slow split schedule, and leaves the
    thread rounding to nearest."""
    rng = np.random.default_rng(3)
    a, b = spread_codes(rng, "e4m3", (5, 300)), spread_codes(rng, "e4m3", (70, 300))
    want = [accumulate_codes(a, b, "e4m3", "e4m3", preset, fast, splits, scheme, reference=True)
            for preset, fast, splits, scheme in ((HOPPER, True, 1, "none"), (ADA, False, 3, "pairwise"))]
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="+avx,+avx2,+fma,+f16c,+popcnt,+sse4.2",
               MMAEMU_CACHE_DIR=str(tmp_path))
    env.pop("MMAEMU_CPU_ENGINE", None)
    run = subprocess.run([sys.executable, "-c", HASWELL_RUN, a.tobytes().hex(), b.tobytes().hex()], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["mxcsr", "offset"] + [w.view(np.uint32).tobytes().hex() for w in want] + ["0"]

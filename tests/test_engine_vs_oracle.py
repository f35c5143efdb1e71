"""The Numba engine agrees bit for bit with the independent slow oracle (tests/oracle.py: Python integers and
Fractions written from the spec, sharing no code with mmaemu) on thousands of random and adversarial cases:
subnormals, +-0, exact cancellations, wide exponent spreads inside a block, NaN/Inf codes, K not a multiple of
16/32/64/128, every format pair, every output dtype, every split scheme with S up to 24 (splits that own no tile
included), and custom presets.
"""

import itertools

import numpy as np
import pytest
import torch

import mmaemu
import oracle
from mmaemu.cpu import accumulate_codes, epilogue_codes
from mmaemu.model.presets import ADA, B200_MMA_SYNC, HOPPER, Preset
from mmaemu.testing import assert_bitwise_equal

PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]
OUTS = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
CUSTOM = Preset("custom-8x20", nfma=8, frac=20, frac_out=16, min_exp=-140, late_c=False, slow_chunk=96)
CUSTOM_COARSE = Preset("custom-64x3", nfma=64, frac=3, frac_out=5, min_exp=-132, late_c=False, slow_chunk=128)
NONFINITE = {"e4m3": [0x7F, 0xFF], "e5m2": [0x7C, 0xFC, 0x7D, 0xFE, 0x7F]}


def _finite_codes(fmt):
    return np.array([c for c in range(256) if c not in set(_all_nonfinite(fmt))], np.uint8)


def _all_nonfinite(fmt):
    if fmt == "e4m3":
        return [0x7F, 0xFF]
    return [c | s for c in range(0x7C, 0x80) for s in (0, 0x80)]


def _codes_with_exponent_fields(fmt, fields, rng, shape):
    """Random codes whose exponent field lies in ``fields`` (random sign and mantissa)."""
    mbits = 3 if fmt == "e4m3" else 2
    field = rng.choice(fields, size=shape)
    mant = rng.integers(0, 1 << mbits, size=shape)
    sign = rng.integers(0, 2, size=shape) << 7
    codes = (sign | (field << mbits) | mant).astype(np.uint8)
    bad = np.isin(codes, _all_nonfinite(fmt))
    codes[bad] &= 0xF0  # keep the case finite
    return codes


def operand(kind, fmt, rng, shape):
    """Codes of one adversarial family."""
    top = 15 if fmt == "e4m3" else 30
    if kind == "uniform":
        return rng.choice(_finite_codes(fmt), size=shape)
    if kind == "subnormal":  # subnormals, the smallest normals and +-0
        return _codes_with_exponent_fields(fmt, [0, 0, 0, 1], rng, shape)
    if kind == "spread":  # the largest and the tiniest values side by side in every block
        return _codes_with_exponent_fields(fmt, [0, 1, top - 1, top], rng, shape)
    if kind == "narrow":  # one binade: sums where no product is truncated
        return _codes_with_exponent_fields(fmt, [top // 2], rng, shape)
    if kind == "sparse":  # mostly zeros (+0 and -0)
        codes = rng.choice(_finite_codes(fmt), size=shape)
        codes[rng.random(shape) < 0.8] = rng.choice([0x00, 0x80])
        return codes
    raise ValueError(kind)


def cancelling(a_fmt, rng, K):
    """A row whose products cancel exactly against an all-equal B row: x, -x pairs (a sum of exactly 0)."""
    half = operand("uniform", a_fmt, rng, (K // 2,))
    row = np.concatenate([half, half ^ 0x80, np.zeros(K - 2 * (K // 2), np.uint8)])
    return rng.permutation(row)


def with_nonfinite(codes, fmt, rng):
    out = codes.copy()
    flat = out.reshape(-1)
    flat[rng.integers(0, flat.size)] = rng.choice(NONFINITE[fmt])
    return out


def random_split(preset, rng):
    """A split scheme the preset accepts, S up to 24 (often more splits than tiles)."""
    if rng.random() < 0.3:
        return 1, "none"
    schemes = {"hopper": ["contiguous"], "ada": ["serial", "pairwise"]}.get(
        preset.name, ["contiguous", "serial", "pairwise"])
    return int(rng.integers(2, 25)), str(rng.choice(schemes))


def oracle_preset(preset):
    return preset  # the oracle reads nfma, frac, frac_out, min_exp, late_c and slow_chunk only


def engine_accumulate(a, b, fa, fb, preset, fast, S, scheme, reference):
    return accumulate_codes(a, b, fa, fb, preset, fast, S, scheme, reference=reference).view(np.uint32)


def accumulate_case(seed):
    """One random case: (a, b, fmt_a, fmt_b, preset, fast, S, scheme)."""
    rng = np.random.default_rng(seed)
    fa, fb = PAIRS[seed % 4]
    preset = [HOPPER, ADA, CUSTOM, CUSTOM_COARSE, B200_MMA_SYNC][seed % 5]
    K = int(rng.choice([int(rng.integers(1, 300)), 16, 32, 64, 96, 128, 200, 256, 384]))
    M, N = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    kind_a, kind_b = rng.choice(["uniform", "subnormal", "spread", "narrow", "sparse"], size=2)
    a = operand(kind_a, fa, rng, (M, K))
    b = operand(kind_b, fb, rng, (N, K))
    if rng.random() < 0.25:
        a[0] = cancelling(fa, rng, K)
        b[:] = b[0] if rng.random() < 0.5 else b
    if rng.random() < 0.15:
        a = with_nonfinite(a, fa, rng) if rng.random() < 0.5 else a
        b = with_nonfinite(b, fb, rng) if rng.random() < 0.5 else b
    if preset.slow_chunk is None:
        fast, (S, scheme) = True, (1, "none")
    else:
        fast = bool(rng.random() < 0.5)
        S, scheme = random_split(preset, rng)
        if scheme in ("serial", "pairwise") and 64 % preset.nfma:
            S, scheme = 1, "none"
    return a, b, fa, fb, preset, fast, S, scheme


@pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning")
@pytest.mark.parametrize("chunk", range(12))
def test_accumulate_matches_oracle(chunk):
    """~1,200 random/adversarial accumulate cases (about 6,000 outputs), fast and reference engines."""
    for seed in range(chunk * 100, chunk * 100 + 100):
        a, b, fa, fb, preset, fast, S, scheme = accumulate_case(seed)
        expected = np.array(oracle.accumulate(a.tolist(), b.tolist(), fa, fb, oracle_preset(preset), fast, S,
                                              scheme), np.uint32).reshape(a.shape[0], b.shape[0])
        for reference in (False, True):
            got = engine_accumulate(a, b, fa, fb, preset, fast, S, scheme, reference)
            assert_bitwise_equal(got, expected, msg=f"seed {seed}: {preset.name} {fa}x{fb} fast={fast} "
                                                    f"S={S} {scheme} K={a.shape[1]} reference={reference}")


def random_fp32_bits(rng, n):
    """fp32 patterns: arbitrary bits, +-0, +-Inf, NaNs, subnormals, values near 1 and near the fp8 ranges."""
    pools = [
        rng.integers(0, 1 << 32, n, dtype=np.uint64),
        rng.choice([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF, 0x00000001,
                    0x807FFFFF, 0x43E00000, 0x47600000, 0x477FF000], n),
        rng.integers(0, 1 << 23, n) | (rng.integers(0, 2, n) << 31),  # subnormals
        (rng.integers(100, 155, n) << 23) | rng.integers(0, 1 << 23, n) | (rng.integers(0, 2, n) << 31),
    ]
    which = rng.integers(0, len(pools), n)
    return np.choose(which, pools).astype(np.uint64) & 0xFFFFFFFF


def test_epilogue_matches_oracle():
    """About 12,000 epilogue evaluations: every output dtype, scale_result on/off, random and special scales."""
    rng = np.random.default_rng(2026)
    for trial in range(240):
        sa, sb, sr = (int(x) for x in random_fp32_bits(rng, 3))
        if trial % 3 == 0:  # ordinary scales most often matter most
            sa, sb = (int(np.float32(x).view(np.uint32)) for x in rng.uniform(-4, 4, 2))
        out = OUTS[trial % 5]
        scale_result = sr if trial % 2 else None
        acc_bits = random_fp32_bits(rng, 50).astype(np.uint32)
        got = epilogue_codes(acc_bits.view(np.float32), sa, sb, scale_result, out)
        expected = [oracle.epilogue(int(x), sa, sb, scale_result, out) for x in acc_bits]
        assert [int(g) for g in got] == expected, (trial, out, hex(sa), hex(sb), scale_result)


def dot_case(seed):
    rng = np.random.default_rng(10_000 + seed)
    fa, fb = PAIRS[seed % 4]
    preset = [HOPPER, ADA, B200_MMA_SYNC, CUSTOM, CUSTOM_COARSE][seed % 5]
    R, K = int(rng.integers(1, 5)), int(rng.integers(0, 100))
    kind = rng.choice(["uniform", "subnormal", "spread", "narrow", "sparse"])
    a, b = operand(kind, fa, rng, (R, K)), operand("uniform", fb, rng, (R, K))
    if rng.random() < 0.2 and K:
        a = with_nonfinite(a, fa, rng)
    c_bits = random_fp32_bits(rng, R).astype(np.uint32)
    if rng.random() < 0.5:  # finite accumulators of every size, tiny and huge included
        c_bits &= 0xFF7FFFFF
    return a, b, fa, fb, preset, c_bits


@pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning")
def test_dot_matches_oracle():
    """Instruction-level chains from arbitrary fp32 accumulators (clamps of b.1, late c of b.2, specials)."""
    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    for seed in range(300):
        a, b, fa, fb, preset, c_bits = dot_case(seed)
        c = torch.from_numpy(c_bits.view(np.float32).copy())
        got = mmaemu.model.dot(torch.from_numpy(a).view(dtype[fa]), torch.from_numpy(b).view(dtype[fb]), c,
                               preset=preset)
        expected = [oracle.dot(a[r].tolist(), b[r].tolist(), fa, fb, int(c_bits[r]), preset)
                    for r in range(a.shape[0])]
        assert_bitwise_equal(got, torch.tensor(np.array(expected, np.uint32).view(np.float32)),
                             msg=f"seed {seed}: {preset.name} {fa}x{fb} K={a.shape[1]}")


@pytest.mark.parametrize("out,pair", list(itertools.product(OUTS, PAIRS[:3])))
def test_scaled_mm_end_to_end_matches_oracle(out, pair):
    """The public scaled_mm (validation, planning, engine, epilogue) on small GEMMs, every out dtype."""
    fa, fb = pair
    if fa == fb == "e4m3" and out == "float8_e5m2":
        pytest.skip("rejected by the reference platform (tested in test_validate.py)")
    rng = np.random.default_rng(hash((out, pair)) % 2**32)
    M, N, K = 3, 16, 80
    a = operand("uniform", fa, rng, (M, K))
    w = operand("spread", fb, rng, (N, K))
    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    sa, sb = np.float32(rng.uniform(0.001, 0.1)), np.float32(rng.uniform(-2, 2))
    sr = np.float32(rng.uniform(0.5, 8))
    result = mmaemu.scaled_mm(torch.from_numpy(a).view(dtype[fa]), torch.from_numpy(w).view(dtype[fb]).t(),
                              torch.tensor(sa), torch.tensor(sb), scale_result=torch.tensor(sr),
                              out_dtype=getattr(torch, out), use_fast_accum=False, profile="ada", splitk=(3, "pairwise"))
    acc = oracle.accumulate(a.tolist(), w.tolist(), fa, fb, ADA, False, 3, "pairwise")
    bits = [[oracle.epilogue(x, int(sa.view(np.uint32)), int(sb.view(np.uint32)), int(sr.view(np.uint32)), out)
             for x in row] for row in acc]
    width = {"float32": np.uint32, "bfloat16": np.uint16, "float16": np.uint16}.get(out, np.uint8)
    assert_bitwise_equal(result, torch.from_numpy(np.array(bits, width)).view(result.dtype), msg=out)

"""Block-wise FP8 (mmaemu.arith.scaled, mmaemu.cpu.chunked, mmaemu.cuda.blockwise.kernel, mmaemu.deepgemm) against the
independent oracle (tests/oracle.py, section g: plain integers) and MMA-Sim's Hopper WGMMA k32 chains.

* the round-to-nearest fp32 FMA against the oracle's integer FMA and against Fractions, on random and adversarial
  triples (ties, double-rounding traps, cancellation, subnormal results, overflow, NaN/Inf);
* 100,000 outputs per recipe ((1, 128, 128) bf16 and (1, 1, 128) fp32 reduce-add): chunk partials from mmaemu's
  tensor-wise engine (oracle-tested elsewhere; the small full test below re-derives them in the oracle), the combine
  and output by the oracle; non-power-of-two, subnormal, huge, zero, NaN and Inf scales, NaN codes, K = 300;
* the simulator worker: cuda:simple equals the CPU reference engine.
"""

from __future__ import annotations

import json
import sys
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from numba import njit

import oracle
from subprocess_workers import workers_fixture

import mmaemu
import mmaemu.deepgemm as dg
from mmaemu.arith.scaled import fma_nearest
from mmaemu.errors import BackendUnavailableError, ReferenceRejectsError, UnsupportedFeatureError
from mmaemu.model.chunked import CHUNKED_KERNELS

pytestmark = pytest.mark.filterwarnings("ignore::mmaemu.ExperimentalPresetWarning")


@njit
def _fma_many(a, b, c, out):
    for i in range(a.size):
        out[i] = fma_nearest(a[i], b[i], c[i])


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def _f32(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


def _fma_triples(rng, n):
    """float32 (a, b, c): random, ties, double-rounding traps, cancellation, subnormal results, overflow,
    specials."""
    parts = []
    q = n // 8
    # random bits over the whole finite range
    bits = rng.integers(0, 2**32, (3, q), dtype=np.uint64).astype(np.uint32)
    bits[(bits >> 23 & 0xFF) == 0xFF] &= 0xBFFFFFFF
    parts.append(_f32(bits))
    # moderate exponents so that a*b and c overlap
    mags = [np.ldexp(rng.uniform(1, 2, q), rng.integers(-20, 20, q)) * rng.choice([-1, 1], q) for _ in range(3)]
    parts.append(np.array(mags, np.float32))
    # ties: (2**12 + j) * (2**12 + i) has 25 significant bits, odd last one; c = 0 or a tiny c (double-rounding trap)
    i, j = rng.integers(1, 2**11, q) * 2 + 1, rng.integers(1, 2**11, q) * 2 + 1
    e = rng.integers(-40, 40, q)
    a = np.ldexp((2.0**12 + i), e)
    b = np.ldexp((2.0**12 + j), -e)
    c = np.where(rng.random(q) < 0.5, 0.0, np.ldexp(rng.choice([-1.0, 1.0], q), rng.integers(-149, -60, q)))
    parts.append(np.array([a, b, c], np.float32))
    # cancellation: c = -RN(a*b), the result is the product's rounding error
    a, b = (np.float32(np.ldexp(rng.uniform(1, 2, q), rng.integers(-60, 60, q))) for _ in range(2))
    parts.append(np.array([a, b, -(a * b)], np.float32))
    # subnormal results: tiny products and tiny c
    a = np.ldexp(rng.uniform(1, 2, q), rng.integers(-80, -60, q))
    b = np.ldexp(rng.uniform(1, 2, q), rng.integers(-80, -60, q)) * rng.choice([-1, 1], q)
    c = np.ldexp(rng.uniform(0, 1, q), -126) * rng.choice([-1, 1], q)
    parts.append(np.array([a, b, c], np.float32))
    # near overflow: products around 2**128, c pulling back
    a = np.ldexp(rng.uniform(1, 2, q), 64)
    b = np.ldexp(rng.uniform(1, 2, q), 63)
    c = -np.ldexp(rng.uniform(0, 2, q), 127)
    parts.append(np.array([a, b, c], np.float32))
    # specials mixed with everything
    choice = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 2.0**-149, 3.4e38], np.float32)
    parts.append(choice[rng.integers(0, choice.size, (3, q))])
    # signed zeros: products that are zero with c = -0 or +0
    zs = np.array([0.0, -0.0], np.float32)
    parts.append(np.array([zs[rng.integers(0, 2, q)], rng.standard_normal(q), zs[rng.integers(0, 2, q)]],
                          np.float32))
    triples = np.concatenate(parts, axis=1).astype(np.float32)
    return triples[0].copy(), triples[1].copy(), triples[2].copy()


def _same(ours, theirs):
    """Equal fp32 bits, NaN against NaN of any payload."""
    ours, theirs = np.asarray(ours, np.uint32), np.asarray(theirs, np.uint32)
    nan_o = (ours & 0x7FFFFFFF) > 0x7F800000
    nan_t = (theirs & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan_o | nan_t, nan_o & nan_t, ours == theirs)


def test_fma_nearest_equals_the_oracle_and_rationals():
    rng = np.random.default_rng(19)
    a, b, c = _fma_triples(rng, 40_000)
    ours = np.empty_like(a)
    _fma_many(a, b, c, ours)
    ab, bb, cb = _bits(a), _bits(b), _bits(c)
    theirs = np.array([oracle.fp32_fma(int(x), int(y), int(z)) for x, y, z in zip(ab, bb, cb)], np.uint64)
    good = _same(_bits(ours), theirs.astype(np.uint32))
    bad = np.flatnonzero(~good)[:5]
    assert good.all(), [(float(a[i]), float(b[i]), float(c[i]), hex(_bits(ours)[i]), hex(int(theirs[i])))
                        for i in bad]
    # The integer oracle itself against Fractions on the finite cases (a sample).
    finite = np.flatnonzero(np.isfinite(a) & np.isfinite(b) & np.isfinite(c))[::20]
    for i in finite:
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        if exact != 0 and abs(exact) < Fraction(2) ** 128:
            assert oracle.round_fp32(exact) == int(theirs[i]), (a[i], b[i], c[i])
    # The cases discriminate: a separate multiply and add differ from the FMA on many of them, ties included.
    with np.errstate(all="ignore"):
        separate = (a * b) + c
    assert (~_same(_bits(separate), _bits(ours))).sum() > 5_000


# ------------------------------------------------------------------------------------------------------------
# GEMMs


def _e4m3_codes(rng, rows, K, nan_rows=()):
    codes = rng.integers(0, 256, (rows, K)).astype(np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C
    for r, k in nan_rows:
        codes[r, k] = 0x7F
    return codes


def _scales(rng, shape):
    """fp32 scales: mostly non-power-of-two over a wide range, some subnormal, huge, zero, NaN and Inf."""
    s = np.ldexp(rng.uniform(1, 2, shape), rng.integers(-12, 12, shape)).astype(np.float32)
    pick = rng.random(shape)
    s[pick < 0.03] = np.ldexp(rng.uniform(1, 2, shape), -140)[pick < 0.03]
    s[(pick >= 0.03) & (pick < 0.05)] = np.float32(2.0**100) * np.float32(1.375)
    s[(pick >= 0.05) & (pick < 0.06)] = 0.0
    s[(pick >= 0.06) & (pick < 0.065)] = np.nan
    s[(pick >= 0.065) & (pick < 0.07)] = np.inf
    return s.astype(np.float32)


def _tensor(codes):
    return torch.from_numpy(np.ascontiguousarray(codes)).view(torch.float8_e4m3fn)


def _chunk_partials(a, b, K):
    """fp32 bits [chunks, M, N] of every chunk's chain from +0 (mmaemu's tensor-wise engine, fast accumulation
    over the chunk: oracle-tested by the tensor-wise suites)."""
    out = []
    for k0 in range(0, K, 128):
        acc = mmaemu.accumulate(_tensor(a[:, k0:k0 + 128]), _tensor(b[:, k0:k0 + 128]), use_fast_accum=True,
                                profile="hopper", splitk=1, backend="cpu")
        out.append(acc.numpy().view(np.uint32))
    return np.stack(out)


M, N, K = 250, 400, 300  # 100,000 outputs, three chunks (the last one 44 wide)


@pytest.mark.parametrize("recipe", [(1, 128, 128), (1, 1, 128)], ids=["1d2d-bf16", "1d1d-fp32"])
def test_100k_outputs_against_the_oracle(recipe):
    rng = np.random.default_rng(1900 + recipe[1])
    chunks = -(-K // 128)
    a = _e4m3_codes(rng, M, K, nan_rows=[(3, 5), (7, 290)])
    b = _e4m3_codes(rng, N, K, nan_rows=[(11, 130)])
    sfa = _scales(rng, (M, chunks))
    blockwise = recipe[1] == 128
    sfb = _scales(rng, (-(-N // 128), chunks) if blockwise else (N, chunks))
    if blockwise:
        d = torch.empty((M, N), dtype=torch.bfloat16)
        dg.fp8_gemm_nt((_tensor(a), torch.from_numpy(sfa)), (_tensor(b), torch.from_numpy(sfb)), d)
        ours = d.view(torch.int16).numpy().view(np.uint16).astype(np.int64)
        d_old = np.zeros((M, N), np.uint32)
    else:
        d0 = (rng.standard_normal((M, N)) * 2.0 ** rng.integers(-10, 30, (M, N))).astype(np.float32)
        d0[0, :7] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -3e38]
        d_old = d0.view(np.uint32).copy()
        d = torch.from_numpy(d0.copy())
        dg.fp8_gemm_nt((_tensor(a), torch.from_numpy(sfa)), (_tensor(b), torch.from_numpy(sfb)), d, c=d,
                       recipe=recipe)
        ours = d.numpy().view(np.uint32).astype(np.int64)
    partials = _chunk_partials(a, b, K)
    sa_bits = sfa.view(np.uint32)
    sb_rows = (np.repeat(sfb, 128, axis=0)[:N] if blockwise else sfb).view(np.uint32)
    out = "bfloat16" if blockwise else "float32"
    chunk_lists = partials.transpose(1, 2, 0).tolist()  # [M][N][chunks] Python ints
    sa_lists, sb_lists, d_lists = sa_bits.tolist(), sb_rows.tolist(), d_old.tolist()
    theirs = np.array([[oracle.blockwise_output(chunk_lists[m][n], sa_lists[m], sb_lists[n], out, d_lists[m][n])
                        for n in range(N)] for m in range(M)], np.int64)
    bad = np.argwhere(ours != theirs)
    assert bad.size == 0, [(tuple(i), hex(ours[tuple(i)]), hex(theirs[tuple(i)])) for i in bad[:5]]
    # Every kind of output occurs: NaN, Inf, zero, subnormal-scale results, ordinary values.
    if blockwise:
        assert ((ours & 0x7FFF) == 0x7FFF).any() and ((ours & 0x7FFF) == 0x7F80).any()
    # The reference engine gives the same bits.
    d_ref = torch.empty((M, N), dtype=torch.bfloat16) if blockwise else torch.from_numpy(d_old.view(np.float32).copy())
    dg.fp8_gemm_nt((_tensor(a), torch.from_numpy(sfa)), (_tensor(b), torch.from_numpy(sfb)), d_ref,
                   c=None if blockwise else d_ref, recipe=recipe, backend="reference")
    assert torch.equal(d_ref.view(torch.int16 if blockwise else torch.int32),
                       d.view(torch.int16 if blockwise else torch.int32))


def test_the_combine_is_discriminating():
    """With these scales, a separate multiply and add, or CUTLASS's fma(RN(partial * sa), sb, acc), give other
    accumulators on many outputs: the 100k test tells the combine rules apart."""
    rng = np.random.default_rng(7)
    a, b = _e4m3_codes(rng, 40, 300), _e4m3_codes(rng, 50, 300)
    sfa, sfb = _scales(rng, (40, 3)), _scales(rng, (50, 3))
    partials = _chunk_partials(a, b, 300)
    differ_sep = differ_cutlass = 0
    for m in range(40):
        for n in range(50):
            p = [int(x) for x in partials[:, m, n]]
            sa, sb = [int(x) for x in sfa[m].view(np.uint32)], [int(x) for x in sfb[n].view(np.uint32)]
            fused = oracle.blockwise_accumulator(p, sa, sb)
            sep = cut = 0
            for pk, x, y in zip(p, sa, sb):
                sep = oracle.fp32_add_int(sep, oracle.fp32_mul_int(oracle.fp32_mul_int(x, y), pk))
                cut = oracle.fp32_fma(oracle.fp32_mul_int(pk, x), y, cut)
            differ_sep += sep != fused
            differ_cutlass += cut != fused
    assert differ_sep > 100 and differ_cutlass > 100


def test_small_gemm_with_chunks_from_the_oracle():
    """The whole computation in the oracle (chains included) on a small GEMM with NaN codes and a ragged K."""
    rng = np.random.default_rng(3)
    m, n, k = 5, 7, 300
    a = _e4m3_codes(rng, m, k, nan_rows=[(1, 140)])
    b = _e4m3_codes(rng, n, k)
    sfa, sfb = _scales(rng, (m, 3)), _scales(rng, (1, 3))
    d = torch.empty((m, n), dtype=torch.bfloat16)
    dg.fp8_gemm_nt((_tensor(a), torch.from_numpy(sfa)), (_tensor(b), torch.from_numpy(sfb)), d)
    ours = d.view(torch.int16).numpy().view(np.uint16)
    for i in range(m):
        for j in range(n):
            want = oracle.blockwise_one([int(x) for x in a[i]], [int(x) for x in b[j]], "e4m3", "e4m3",
                                        [int(x) for x in sfa[i].view(np.uint32)],
                                        [int(x) for x in sfb[0].view(np.uint32)], "bfloat16")
            assert int(ours[i, j]) == want, (i, j)


def test_engine_fast_paths_equal_the_reference_engine():
    """Both CPU fast paths (the fused E4M3 one and the per-chunk one of other format pairs, Inf codes included)
    against the reference engine, with ragged K and N."""
    from mmaemu.cpu.chunked import accumulate_chunked_codes
    from mmaemu.model.chunked import CHUNKED_KERNELS

    rng = np.random.default_rng(17)
    for fmt_a, fmt_b in [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]:
        for m, n, k in [(9, 130, 1000), (5, 3, 100)]:
            a = rng.integers(0, 256, (m, k)).astype(np.uint8)
            b = rng.integers(0, 256, (n, k)).astype(np.uint8)
            a[(a & 0x7F) >= 0x7C] = 0x38  # mostly finite, then a few NaN/Inf codes
            b[(b & 0x7F) >= 0x7C] = 0x38
            a[1, k - 1], b[2, 0] = 0x7C, 0xFC
            chunks = -(-k // 128)
            sfa, sfb = _scales(rng, (m, chunks)), _scales(rng, (n, chunks))
            for kernel in CHUNKED_KERNELS.values():
                fast = accumulate_chunked_codes(a, b, fmt_a, fmt_b, sfa, sfb, kernel)
                ref = accumulate_chunked_codes(a, b, fmt_a, fmt_b, sfa, sfb, kernel, reference=True)
                assert _same(_bits(fast), _bits(ref)).all(), (fmt_a, fmt_b, m, n, k)


def test_fused_fast_path_with_prepared_b_equals_the_reference_engine():
    """The fused E4M3 path reading a prepared B (kept weight): one row and a few (bfloat16 panels,
    mmaemu.cpu.gemm.FEW_ROWS), more rows (fp32 panels), NaN codes, ragged K and N."""
    from mmaemu.cpu.chunked import accumulate_chunked_codes
    from mmaemu.cpu.engine import prepare_b
    from mmaemu.model.chunked import CHUNKED_KERNELS

    rng = np.random.default_rng(23)
    for m, n, k in [(1, 130, 1000), (2, 17, 300), (4, 300, 129), (9, 130, 1000)]:
        a = rng.integers(0, 256, (m, k)).astype(np.uint8)
        b = rng.integers(0, 256, (n, k)).astype(np.uint8)
        a[(a & 0x7F) == 0x7F] = 0x38
        b[(b & 0x7F) == 0x7F] = 0x38
        b[n // 2, k - 1] = 0x7F
        chunks = -(-k // 128)
        sfa, sfb = _scales(rng, (m, chunks)), _scales(rng, (n, chunks))
        prepared = prepare_b(b, "e4m3")
        for kernel in CHUNKED_KERNELS.values():
            fast = accumulate_chunked_codes(a, b, "e4m3", "e4m3", sfa, sfb, kernel, prepared_b=prepared)
            ref = accumulate_chunked_codes(a, b, "e4m3", "e4m3", sfa, sfb, kernel, reference=True)
            assert _same(_bits(fast), _bits(ref)).all(), (m, n, k, kernel.name)


def test_chunks_start_at_absolute_multiples_of_128():
    """Large products at k = 120..127 and small ones at 128..135, the second chunk scaled by 2**40: the small ones
    form their own chunk from +0 (a chunk that straddled k = 128 would truncate them against the large ones), so
    the result is RN(2**40 * 8 * 2**-9 + 8 * 448**2), derived here by hand."""
    k = 256
    a = np.zeros((1, k), np.uint8)
    b = np.zeros((1, k), np.uint8)
    a[0, 120:128], b[0, 120:128] = 0x7E, 0x7E  # 448 * 448
    a[0, 128:136], b[0, 128:136] = 0x01, 0x38  # 2**-9 * 1
    sfa = np.array([[1.0, 2.0**40]], np.float32)
    sfb = np.array([[1.0, 1.0]], np.float32)
    d = torch.zeros((1, 1))
    dg.fp8_gemm_nt((_tensor(a), torch.from_numpy(sfa)), (_tensor(b), torch.from_numpy(sfb)), d, c=d,
                   recipe=(1, 1, 128))
    want = oracle.blockwise_one(a[0].tolist(), b[0].tolist(), "e4m3", "e4m3", sfa[0].view(np.uint32).tolist(),
                                sfb[0].view(np.uint32).tolist(), "float32", 0)
    assert int(d.numpy().view(np.uint32)[0, 0]) == want
    assert d.item() == float(np.float32(2.0**34 + 8 * 448.0**2))


# ------------------------------------------------------------------------------------------------------------
# MMA-Sim: Hopper wgmma k32 chains as the external oracle of every chunk


# The MMA-Sim fixture ``sim`` (its models, or a skip that says why not): tests/conftest.py.


def test_every_chunk_equals_mmasim_wgmma_chains(sim):
    from instruction_cases import instruction_cases

    rows_a, rows_b, k = 16, 24, 300
    a = instruction_cases("e4m3", "e4m3", k, 2 * rows_a, 13, 1901)[0][::2]
    b = instruction_cases("e4m3", "e4m3", k, 2 * rows_b, 13, 1902)[1][1::2]
    rng = np.random.default_rng(5)
    sfa, sfb = _scales(rng, (rows_a, 3)), _scales(rng, (1, 3))
    d = torch.empty((rows_a, rows_b), dtype=torch.bfloat16)
    dg.fp8_gemm_nt((_tensor(a), torch.from_numpy(sfa)), (_tensor(b), torch.from_numpy(sfb)), d)
    ours = d.view(torch.int16).numpy().view(np.uint16)
    model = sim.WGMMA("Hopper", "m64n8k32.f32.e4m3.e4m3")
    outputs = rows_a * rows_b
    partials = []
    for k0 in range(0, k, 128):
        a_rows = np.zeros((rows_a, rows_b, 128), np.uint8)
        b_rows = np.zeros((rows_a, rows_b, 128), np.uint8)
        width = min(128, k - k0)
        a_rows[:, :, :width] = a[:, None, k0:k0 + width]
        b_rows[:, :, :width] = b[None, :, k0:k0 + width]
        a_t = _tensor(a_rows.reshape(outputs, 128))
        b_t = _tensor(b_rows.reshape(outputs, 128))
        c = torch.zeros(outputs, dtype=torch.float32)
        for j in range(0, 128, 32):
            c = model.dpa(a_t[:, j:j + 32], b_t[:, j:j + 32], c)
        partials.append(c.numpy().view(np.uint32).reshape(rows_a, rows_b))
    partials = np.stack(partials)
    # MMA-Sim's chunks against mmaemu's chunk partials, then the oracle's combine against mmaemu's output.
    assert np.array_equal(_same(partials, _chunk_partials(a, b, k)), np.ones_like(partials, bool))
    for i in range(rows_a):
        for j in range(rows_b):
            want = oracle.blockwise_output([int(p) for p in partials[:, i, j]],
                                           [int(x) for x in sfa[i].view(np.uint32)],
                                           [int(x) for x in sfb[0].view(np.uint32)], "bfloat16")
            assert int(ours[i, j]) == want, (i, j)


# ------------------------------------------------------------------------------------------------------------
# The API: DeepGEMM's variants, assertions and helpers


def _operands(rng, m, n, k, recipe=(1, 128, 128)):
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
    w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)).to(torch.bfloat16)
    a = dg.per_token_cast_to_fp8(x, use_ue8m0=False)
    b = dg.per_block_cast_to_fp8(w, use_ue8m0=False) if recipe[1] == 128 else dg.per_token_cast_to_fp8(w, False)
    return x, w, a, b


def test_variants_are_transposes_of_nt():
    rng = np.random.default_rng(11)
    x, w, a, b = _operands(rng, 33, 260, 200)
    d = torch.empty((33, 260), dtype=torch.bfloat16)
    dg.fp8_gemm_nt(a, b, d)
    # As DeepGEMM's tests do: the transposed operand is a transposed view of the K-major one.
    for name, aa, bb in [("nn", a, (b[0].T, b[1].T)), ("tn", (a[0].T, a[1].T), (b[0].T, b[1].T)),
                         ("tt", (a[0].T, a[1].T), b)]:
        d2 = torch.empty_like(d)
        getattr(dg, f"fp8_gemm_{name}")(aa, bb, d2)
        assert torch.equal(d.view(torch.int16), d2.view(torch.int16)), name
    # nn with a row-major [K, N] b is MN-major after the transpose: sm_90 refuses it, as DeepGEMM does.
    with pytest.raises(ReferenceRejectsError, match="K-major"):
        dg.fp8_gemm_nn(a, (b[0].T.contiguous(), b[1].T.contiguous()), torch.empty_like(d))
    ref = x.float() @ w.float().T
    assert (d.float() - ref).abs().max() < 0.05 * ref.abs().max()


def test_assertions_are_clear_errors():
    rng = np.random.default_rng(12)
    _, _, a, b = _operands(rng, 16, 256, 256)
    d = torch.empty((16, 256), dtype=torch.bfloat16)
    cases = [
        (lambda: dg.fp8_gemm_nt(a, b, torch.empty((16, 255), dtype=torch.bfloat16)), "shapes"),
        (lambda: dg.fp8_gemm_nt((a[0].float(), a[1]), b, d), "float8_e4m3fn"),
        (lambda: dg.fp8_gemm_nt(a, b, torch.empty((16, 256), dtype=torch.float16)), "bfloat16 or float32"),
        (lambda: dg.fp8_gemm_nt(a, b, d, c=torch.zeros(16, 256)), "with c, d is float32"),
        (lambda: dg.fp8_gemm_nt(a, b, d, recipe=(1, 64, 128)), "recipe"),
        (lambda: dg.fp8_gemm_nt((a[0], a[1][:, :1]), b, d), "sfa.size"),
        (lambda: dg.fp8_gemm_nt(a, (b[0], b[1].T.contiguous().T), d), "contiguous"),
        (lambda: dg.fp8_gemm_nt(a, b, torch.empty((16, 256)), recipe=(1, 1, 128)), "sfb.size"),
        (lambda: dg.fp8_gemm_nt(a, b, torch.empty((16, 256))), "takes no c and writes a bfloat16 d"),
    ]
    for call, text in cases:
        with pytest.raises(ReferenceRejectsError, match=text):
            call()
    _, _, a1, b1 = _operands(rng, 16, 256, 256, recipe=(1, 1, 128))
    with pytest.raises(ReferenceRejectsError, match="pass c=d"):
        dg.fp8_gemm_nt(a1, b1, torch.zeros(16, 256), recipe=(1, 1, 128))
    with pytest.warns(UserWarning, match="never reads c"):
        dg.fp8_gemm_nt(a1, b1, torch.zeros(16, 256), c=torch.zeros(16, 256), recipe=(1, 1, 128))
    with pytest.raises(BackendUnavailableError, match="offset kernel"):
        dg.fp8_gemm_nt(a, b, d, backend="cuda:offset")
    for backend, text in (("cuda", r"backend 'cuda:simple' cannot run: cuda: tensors on cpu"),  # cuda: its kernel
                          ("cuda:native", "gated for cuBLASLt's chains only")):
        with pytest.raises(BackendUnavailableError, match=text):
            dg.fp8_gemm_nt(a, b, d, backend=backend)
    from mmaemu.cuda.blockwise.kernel import chunked_decline

    assert chunked_decline("cuda:simple") is None  # the one backend the block-wise kernels' rule accepts


def test_a_flushing_thread_is_refused():
    rng = np.random.default_rng(18)
    _, _, a, b = _operands(rng, 4, 128, 128)
    torch.set_flush_denormal(True)
    try:
        with pytest.raises(mmaemu.errors.MmaemuError, match="flushes fp32 subnormals"):
            dg.fp8_gemm_nt(a, b, torch.empty((4, 128), dtype=torch.bfloat16))
    finally:
        torch.set_flush_denormal(False)


def test_experimental_maturity_warns_once_per_kernel(fresh_warnings):
    rng = np.random.default_rng(19)
    _, _, a, b = _operands(rng, 4, 128, 128)
    d = torch.empty((4, 128), dtype=torch.bfloat16)
    with pytest.warns(mmaemu.ExperimentalPresetWarning, match="not recorded on hardware") as caught:
        dg.fp8_gemm_nt(a, b, d)
    assert [w.filename for w in caught] == [__file__]  # the caller's line (mmaemu.warn's frame finder)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mmaemu.ExperimentalPresetWarning)
        dg.fp8_gemm_nt(a, b, d)
    assert dg.MATURITY == "experimental" and "c9f8b34dcdacc20aa746b786f983492c51072870" in dg.SOURCE


def test_weight_gradient_adds_into_d():
    rng = np.random.default_rng(13)
    _, _, a, b = _operands(rng, 20, 130, 384, recipe=(1, 1, 128))
    zero = torch.zeros((20, 130))
    dg.fp8_gemm_nt(a, b, zero, c=zero, recipe=(1, 1, 128))
    d = torch.from_numpy(rng.standard_normal((20, 130)).astype(np.float32) * 32)
    want = (d + zero).clone()  # RN(d + final), final = the result into +0
    dg.fp8_gemm_nt(a, b, d, c=d, recipe=(1, 1, 128))
    assert torch.equal(d.view(torch.int32), want.view(torch.int32))


def test_grouped_contiguous_and_masked_equal_per_group_calls():
    rng = np.random.default_rng(14)
    groups, n, k = 3, 256, 256
    w = torch.from_numpy(rng.standard_normal((groups, n, k)).astype(np.float32)).to(torch.bfloat16)
    b_codes = torch.empty((groups, n, k), dtype=torch.float8_e4m3fn)
    b_sf = torch.empty((groups, 2, 2))
    for g in range(groups):
        b_codes[g], b_sf[g] = dg.per_block_cast_to_fp8(w[g], use_ue8m0=False)
    actual = [100, 5, 130]
    m = sum(dg.align(x, 128) for x in actual)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
    a = dg.per_token_cast_to_fp8(x, use_ue8m0=False)
    m_indices = torch.full((m,), -1, dtype=torch.int32)
    start = 0
    for g, rows in enumerate(actual):
        m_indices[start:start + rows] = g
        start += dg.align(rows, 128)
    d = torch.full((m, n), 7.0, dtype=torch.bfloat16)
    dg.m_grouped_fp8_gemm_nt_contiguous(a, (b_codes, b_sf), d, m_indices)
    start = 0
    for g, rows in enumerate(actual):
        seg = slice(start, start + dg.align(rows, 128))
        want = torch.empty((128 * (seg.stop - seg.start) // 128, n), dtype=torch.bfloat16)
        dg.fp8_gemm_nt((a[0][seg], a[1][seg]), (b_codes[g], b_sf[g]), want)
        got = d[seg].clone()
        # waves of 64 rows whose first row is padding are +0; the others are computed with the group's B
        waves = torch.arange(want.shape[0]) // 64 * 64
        computed = waves < rows
        want[~computed] = 0
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), g
        start = seg.stop
    with pytest.raises(UnsupportedFeatureError, match="multiple of"):
        bad = m_indices.clone()
        bad[130] = 2
        dg.m_grouped_fp8_gemm_nt_contiguous(a, (b_codes, b_sf), d, bad)
    # masked: the first masked_m[g] rows of each group, the rest untouched
    max_m = 96
    xa = torch.from_numpy(rng.standard_normal((groups, max_m, k)).astype(np.float32)).to(torch.bfloat16)
    a_codes = torch.empty((groups, max_m, k), dtype=torch.float8_e4m3fn)
    a_sf = torch.empty((groups, max_m, 2))
    for g in range(groups):
        a_codes[g], a_sf[g] = dg.per_token_cast_to_fp8(xa[g], use_ue8m0=False)
    masked_m = torch.tensor([96, 0, 17], dtype=torch.int32)
    d = torch.full((groups, max_m, n), 3.0, dtype=torch.bfloat16)
    dg.m_grouped_fp8_gemm_nt_masked((a_codes, a_sf), (b_codes, b_sf), d, masked_m, expected_m=64)
    for g in range(groups):
        rows = int(masked_m[g])
        if rows:
            want = torch.empty((rows, n), dtype=torch.bfloat16)
            dg.fp8_gemm_nt((a_codes[g, :rows], a_sf[g, :rows]), (b_codes[g], b_sf[g]), want)
            assert torch.equal(d[g, :rows].view(torch.int16), want.view(torch.int16))
        assert (d[g, rows:] == 3.0).all()


def test_casts_follow_deepgemm():
    rng = np.random.default_rng(15)
    x = torch.from_numpy(rng.standard_normal((130, 300)).astype(np.float32)).to(torch.bfloat16)
    codes, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=False)
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == (130, 300) and sf.shape == (130, 3)
    # DeepGEMM's amax / 448.0 on the GPU: CUDA's amax * fp32(1/448) (tests/cuda_torch.py), then x * (1 / sf)
    amax = x[:, :128].abs().float().amax(dim=1).clamp(1e-4).numpy()
    strip = torch.from_numpy(amax * (np.float32(1.0) / np.float32(448.0)))
    assert torch.equal(sf[:, 0], strip)
    assert torch.equal(codes[:, :128].float(), (x[:, :128] * (1.0 / strip[:, None])).to(torch.float8_e4m3fn).float())
    codes, sf = dg.per_block_cast_to_fp8(x, use_ue8m0=True)
    assert sf.shape == (2, 3) and torch.equal(torch.log2(sf), torch.log2(sf).round())
    codes, sf = dg.per_channel_cast_to_fp8(x[:128], use_ue8m0=False)
    assert sf.shape == (1, 300)
    with pytest.raises(ValueError):
        dg.per_channel_cast_to_fp8(x, use_ue8m0=False)


def test_convert_linears_blockwise_quantises_as_deepgemm():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(300, 130), torch.nn.ReLU(), torch.nn.Linear(130, 20, bias=False))
    model = model.to(torch.bfloat16)
    x = torch.randn(5, 300, dtype=torch.bfloat16)
    first = model[0]
    w_fp8, sfb = dg.per_block_cast_to_fp8(first.weight.detach(), use_ue8m0=False)
    x_fp8, sfa = dg.per_token_cast_to_fp8(x, use_ue8m0=False)
    want = torch.empty((5, 130), dtype=torch.bfloat16)
    dg.fp8_gemm_nt((x_fp8, sfa), (w_fp8, sfb), want)
    want = want + first.bias.detach()
    mmaemu.nn.convert_linears(model, recipe="blockwise")
    assert type(model[0]).__name__ == "BlockwiseFP8Linear" and model[0].recipe == "blockwise"
    with torch.no_grad():
        got = model[0](x)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        assert model(x).shape == (5, 20)
    with pytest.raises(ValueError, match="unknown recipe"):
        mmaemu.nn.EmulatedFP8Linear.from_linear(torch.nn.Linear(4, 4), recipe="rowwis")
    with pytest.raises(UnsupportedFeatureError, match="no profile"):
        mmaemu.nn.EmulatedFP8Linear.from_linear(torch.nn.Linear(4, 4), recipe="blockwise", profile="hopper")
    assert mmaemu.nn.EmulatedFP8Linear.from_linear(torch.nn.Linear(4, 4)).recipe == "tensorwise"


def test_recipe_options_reach_the_recipe_layer():
    """``use_ue8m0=`` (an option only the block-wise layer has) passes through from_linear and convert_linears;
    the tensor-wise layer refuses it instead of dropping it."""
    torch.manual_seed(1)
    linear = torch.nn.Linear(256, 128)
    w_fp8, sfb = dg.per_block_cast_to_fp8(linear.weight.detach(), use_ue8m0=True)
    layer = mmaemu.nn.EmulatedFP8Linear.from_linear(linear, recipe="blockwise", use_ue8m0=True)
    assert layer.use_ue8m0 and torch.equal(layer.weight_scale, sfb.float())
    assert torch.equal(layer.weight.view(torch.uint8), w_fp8.view(torch.uint8))
    model = mmaemu.nn.convert_linears(torch.nn.Sequential(torch.nn.Linear(256, 128)), recipe="blockwise",
                                      use_ue8m0=True)
    assert model[0].use_ue8m0
    with pytest.raises(TypeError, match="no option 'use_ue8m0'"):
        mmaemu.nn.EmulatedFP8Linear.from_linear(linear, use_ue8m0=True)


@pytest.mark.parametrize("splitk", ["auto", "assume-unsplit", 1, (1, "none")])
def test_the_recipe_layers_take_every_one_split_value(splitk):
    """One rule (platform.splitk.asks_one_split) for what a kernel without split-K accepts: the row-wise planner,
    its layer and the block-wise layer agree."""
    linear = torch.nn.Linear(128, 16)
    for recipe in ("rowwise", "blockwise"):
        mmaemu.nn.EmulatedFP8Linear.from_linear(linear, recipe=recipe, splitk=splitk)
    for recipe in ("rowwise", "blockwise"):
        with pytest.raises(UnsupportedFeatureError, match="no split-K"):
            mmaemu.nn.EmulatedFP8Linear.from_linear(linear, recipe=recipe, splitk=(2, "contiguous"))


# ------------------------------------------------------------------------------------------------------------
# cuda:simple under the simulator


def _sim_worker():
    from numba.core import config

    assert config.ENABLE_CUDASIM
    from mmaemu.cpu.chunked import accumulate_chunked_codes
    from mmaemu.cuda.blockwise.kernel import accumulate_chunked_numpy
    from mmaemu.model.chunked import CHUNKED_KERNELS

    rng = np.random.default_rng(16)
    report = []
    for kernel in CHUNKED_KERNELS.values():
        for m, n, k in [(3, 5, 300), (2, 17, 64)]:
            a = _e4m3_codes(rng, m, k, nan_rows=[(1, k - 1)])
            b = _e4m3_codes(rng, n, k)
            chunks = -(-k // 128)
            sfa, sfb = _scales(rng, (m, chunks)), _scales(rng, (n, chunks))
            cpu = accumulate_chunked_codes(a, b, "e4m3", "e4m3", sfa, sfb, kernel, reference=True)
            gpu = accumulate_chunked_numpy(a, b, "e4m3", "e4m3", sfa, sfb, kernel)
            report.append({"kernel": kernel.name, "shape": [m, n, k],
                           "mismatches": int((~_same(_bits(cpu), _bits(gpu))).sum()),
                           "nan": int(np.isnan(cpu).sum())})
    print(json.dumps(report))


def _ptx_worker():
    """PTX of the cuda:simple chunked kernel for sm_90, compiled offline: the combine's FMA is fma.rn.f32."""
    import numba
    from numba import types

    from mmaemu.arith.params import preset_params
    from mmaemu.cuda.blockwise.kernel import gemm_chunked_simple
    from mmaemu.model.presets import HOPPER
    from subprocess_workers import offline_ptx

    report = {"skipped": None}
    a8, a16, f32 = types.int8[:, ::1], types.int16[:, ::1], types.float32[:, ::1]
    codes, table, i64 = types.uint8[:, ::1], types.float64[::1], types.int64
    params = numba.typeof(preset_params(HOPPER, "e4m3", "e4m3"))
    ptx = offline_ptx(gemm_chunked_simple, (a8, a16, a8, a16, codes, codes, table, table, f32, f32, i64, i64, params,
                                            f32), (9, 0), report)
    if ptx is not None:
        report["fma_rn"] = ptx.count("fma.rn.f32")
        report["fma_other"] = sum(ptx.count(f"fma.{mode}.f32") for mode in ("rz", "rm", "rp"))
    print(json.dumps(report))


workers = workers_fixture(__file__, {"sim": {"NUMBA_ENABLE_CUDASIM": "1"}, "ptx": {"NUMBA_ENABLE_CUDASIM": "0"}})


@pytest.mark.sim
@pytest.mark.subprocess
def test_cuda_simple_under_the_simulator_equals_the_cpu_reference(workers):
    report = workers("sim")
    assert len(report) == 2 * len(CHUNKED_KERNELS) and all(r["mismatches"] == 0 for r in report), report
    assert any(r["nan"] for r in report)


@pytest.mark.subprocess
def test_the_gpu_combine_is_one_fma_rn(workers):
    report = workers("ptx")
    if report["skipped"]:
        pytest.skip(report["skipped"])
    assert report["fma_rn"] == 1 and report["fma_other"] == 0, report  # the combine, and no contraction


if __name__ == "__main__":
    {"sim": _sim_worker, "ptx": _ptx_worker}[sys.argv[1]]()

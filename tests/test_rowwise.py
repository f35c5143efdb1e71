"""Row-wise scaled_mm (torch 2.7.1's CUTLASS kernel f8f8bf16_rowwise on sm_90), against the independent oracle.

* The oracle's integer fp32 operations (used for speed) equal its Fraction operations.
* The epilogue (:mod:`mmaemu.arith.rowwise` through :func:`mmaemu.cpu.rowwise_epilogue_codes`) equals
  ``oracle.rowwise_epilogue`` on 100,000 outputs per scale order (half with a bias, half without), random and
  adversarial: accumulators of every class (NaN, Inf, subnormal, zeros of both signs), non-power-of-two scales
  for which the two orders differ, subnormal, huge, zero, Inf and NaN scales, bf16 biases with -0, Inf, NaN.
* The dispatch that decides the order (runs_transposed) on both sides of every boundary (values derived by hand
  from the source's rules) and against the oracle's restatement on a grid.
* scaled_mm end to end: the row-wise result equals the oracle's epilogue of ``mmaemu.accumulate`` (fast and slow,
  K not a multiple of 128; over 100,000 outputs per mode) at shapes on both sides of dispatch boundaries, and that
  accumulator equals the oracle's unsplit chains (c.1, c.2) and MMA-Sim's Hopper
  wgmma k32 chains (one chain over K, or 128-k chunks from zero added in fp32).
* torch 2.7.1's checks in their order; the platforms that refuse; explain; the maturity warning; the +0 bias.
* cuda:simple and the row-wise epilogue kernel under the CUDA simulator (a subprocess), equal to the CPU.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import oracle

import mmaemu
from mmaemu.cpu import rowwise_epilogue_codes
from mmaemu.errors import ExperimentalPresetWarning, ReferenceRejectsError, UnsupportedFeatureError
from mmaemu.platform.rowwise import runs_transposed, scale_order

RNG_SEED = 20261202
EPILOGUE_OUTPUTS = 100_000


# ----------------------------------------------------------------------------------------------------------------
# Case generators


def _fp32_bits(values) -> np.ndarray:
    return np.asarray(values, np.float32).view(np.uint32)


def adversarial_accumulators(rng, size) -> np.ndarray:
    """fp32 bit patterns: random bits (every class), ordinary magnitudes, specials, subnormals, signed zeros."""
    kinds = rng.integers(0, 4, size)
    bits = rng.integers(0, 1 << 32, size, dtype=np.uint64).astype(np.uint32)
    normal = _fp32_bits(rng.standard_normal(size) * np.exp2(rng.integers(-20, 20, size)))
    subnormal = rng.integers(0, 1 << 23, size, dtype=np.uint32) | (rng.integers(0, 2, size, dtype=np.uint32) << 31)
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x00000001, 0x80000001, 0x7F7FFFFF,
                         0x00800000, 0x3F800000], np.uint32)
    special = specials[rng.integers(0, specials.size, size)]
    return np.choose(kinds, [bits, normal, subnormal, special]).astype(np.uint32)


def adversarial_scales(rng, size) -> np.ndarray:
    """fp32 scale bits: non-power-of-two scales near 1 (the orders differ), wide magnitudes, subnormal, huge,
    zero, Inf, NaN, negative."""
    kinds = rng.integers(0, 10, size)
    near_one = _fp32_bits(rng.uniform(0.01, 100.0, size))
    wide = _fp32_bits(rng.uniform(1.0, 2.0, size) * np.exp2(rng.integers(-126, 127, size)))
    subnormal = rng.integers(1, 1 << 23, size, dtype=np.uint32)
    huge = _fp32_bits(rng.uniform(1.0, 2.0, size) * np.exp2(rng.integers(100, 127, size)))
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x3F800000, 0x40000000], np.uint32)
    special = specials[rng.integers(0, specials.size, size)]
    negative = near_one | np.uint32(0x80000000)
    choices = [near_one] * 5 + [wide, subnormal, huge, special, negative]
    return np.choose(kinds, choices).astype(np.uint32)


def adversarial_biases(rng, size) -> np.ndarray:
    """bf16 bit patterns: ordinary values, random bits (NaN/Inf included), -0 and +0."""
    kinds = rng.integers(0, 3, size)
    ordinary = (_fp32_bits(rng.standard_normal(size) * np.exp2(rng.integers(-10, 10, size))) >> 16).astype(np.uint16)
    bits = rng.integers(0, 1 << 16, size, dtype=np.uint32).astype(np.uint16)
    zeros = np.where(rng.integers(0, 2, size) == 1, 0x8000, 0).astype(np.uint16)
    return np.choose(kinds, [ordinary, bits, zeros]).astype(np.uint16)


def _oracle_epilogue(acc, xs, ws, bias, transposed):
    M, N = acc.shape
    out = np.empty((M, N), np.uint16)
    for m in range(M):
        x = int(xs[m])
        for n in range(N):
            out[m, n] = oracle.rowwise_epilogue(int(acc[m, n]), x, int(ws[n]),
                                                None if bias is None else int(bias[n]), transposed)
    return out


def _first_difference(got, want, acc, xs, ws, bias):
    bad = np.argwhere(got != want)
    if not bad.size:
        return None
    m, n = bad[0]
    b = "none" if bias is None else f"{int(bias[n]):04X}"
    return (f"{len(bad)} outputs differ; first at ({m}, {n}): acc {int(acc[m, n]):08X}, x {int(xs[m]):08X}, "
            f"w {int(ws[n]):08X}, bias {b}: mmaemu {int(got[m, n]):04X}, oracle {int(want[m, n]):04X}")


# ----------------------------------------------------------------------------------------------------------------
# The oracle's integer operations against its Fraction operations


def test_oracle_integer_operations_match_fraction_operations():
    rng = random.Random(RNG_SEED)
    seeds = np.random.default_rng(RNG_SEED)
    xs = list(map(int, adversarial_accumulators(seeds, 1500))) + [rng.getrandbits(32) for _ in range(1500)]
    ys = list(map(int, adversarial_scales(seeds, 1500))) + [rng.getrandbits(32) for _ in range(1500)]
    for x, y in zip(xs, ys):
        assert oracle.int_fp32_mul(x, y) == oracle.fp32_mul(x, y), (hex(x), hex(y))
        assert oracle.int_fp32_add(x, y) == oracle.fp32_add(x, y), (hex(x), hex(y))
        assert oracle.int_fp32_add(x, x ^ 0x80000000) == oracle.fp32_add(x, x ^ 0x80000000), hex(x)
        assert oracle.int_fp32_to_bf16(x) == oracle.convert_fp32(x, "bfloat16"), hex(x)


# ----------------------------------------------------------------------------------------------------------------
# The epilogue on 100,000 outputs per scale order


@pytest.mark.parametrize("x_first", [True, False], ids=["x-first", "w-first"])
def test_epilogue_matches_oracle(x_first):
    rng = np.random.default_rng(RNG_SEED + x_first)
    M, N = 200, EPILOGUE_OUTPUTS // 400
    differ = 0
    for with_bias in (True, False):
        acc = adversarial_accumulators(rng, M * N).reshape(M, N)
        xs, ws = adversarial_scales(rng, M), adversarial_scales(rng, N)
        bias = adversarial_biases(rng, N) if with_bias else None
        got = rowwise_epilogue_codes(acc.view(np.float32), xs, ws, bias, x_first)
        want = _oracle_epilogue(acc, xs, ws, bias, transposed=not x_first)
        problem = _first_difference(got, want, acc, xs, ws, bias)
        assert problem is None, problem
        other = rowwise_epilogue_codes(acc.view(np.float32), xs, ws, bias, not x_first)
        differ += int((other != got).sum())
    assert differ > 1000, f"only {differ} outputs tell the two multiply orders apart: the cases are too weak"


def test_zero_signs_of_the_bias_add():
    """No bias adds +0: a -0 result becomes +0; a bias of -0 keeps -0 + -0 = -0; x + (-x) = +0."""
    acc = np.array([[-0.0, 0.0, -3.0]], np.float32)
    one = _fp32_bits([1.0])
    ws = _fp32_bits([1.0, 1.0, 1.0])
    assert rowwise_epilogue_codes(acc, one, ws, None, True).tolist() == [[0x0000, 0x0000, 0xC040]]
    neg_zero = np.array([0x8000, 0x8000, 0x4040], np.uint16)  # -0, -0, +3
    assert rowwise_epilogue_codes(acc, one, ws, neg_zero, True).tolist() == [[0x8000, 0x0000, 0x0000]]


# ----------------------------------------------------------------------------------------------------------------
# The dispatch


# (M, N, transposed, the rule that decides), derived by hand from the source's rules; neighbours straddle a boundary.
DISPATCH_CASES = [
    (64, 3072, False, "M = 64, N >= 3072"), (1, 3072, False, "M rounds up to 64"),
    (64, 2816, True, "N % 256 == 0 below the M = 64 rule"), (65, 3072, True, "M rounds up to 128"),
    (3072, 64, True, "N = 64, M >= 3072"), (2816, 64, False, "M % 256 == 0, N % 256 > 0"),
    (3072, 65, False, "N rounds up to 128"),
    (192, 4160, True, "M = 192, N >= 4096"), (192, 4032, False, "xor rule below N = 4096"),
    (193, 4160, False, "M rounds up to 256"),
    (4160, 192, False, "N = 192, M >= 4096"), (4032, 192, True, "xor rule below M = 4096"),
    (4096, 4032, False, "N % 256 > 0, M % 256 == 0 inside M * N <= 4096^2"),
    (4096, 4160, True, "past M * N <= 4096^2: M >= 4096, N >= 4096, M < N"),
    (960, 960, False, "xor: M <= N and M * N <= 1024^2"), (1088, 1088, True, "xor: M * N > 1024^2"),
    (1088, 960, True, "xor: M > N, M * N <= 1024^2"), (960, 1088, False, "xor: M <= N, M * N <= 1024^2"),
    (8192, 4096, False, "M, N >= 4096, M >= N"), (4096, 8192, True, "M, N >= 4096, M < N"),
    (4096, 4096, False, "M, N >= 4096, M == N"), (3840, 4096, True, "fallback (M < 4096): both branches transpose"),
    (4096, 3840, True, "fallback (N < 4096)"), (3840, 8192, True, "fallback, M <= N and both >= 2048"),
    (8192, 3840, True, "fallback, M > N"), (2048, 8192, True, "fallback at M * N = 4096^2"),
]


@pytest.mark.parametrize("M,N,transposed,rule", DISPATCH_CASES, ids=[f"{c[0]}x{c[1]}" for c in DISPATCH_CASES])
def test_dispatch_boundaries(M, N, transposed, rule):
    assert runs_transposed(M, N) is transposed, rule
    assert oracle.rowwise_runs_transposed(M, N) is transposed, rule
    assert scale_order(M, N).x_first is (not transposed)


def test_dispatch_matches_oracle_on_a_grid():
    sizes = list(range(1, 9000, 61)) + [64 * k for k in range(1, 140)]
    for M in sizes:
        for N in sizes[::3]:
            assert runs_transposed(M, N) == oracle.rowwise_runs_transposed(M, N), (M, N)


# ----------------------------------------------------------------------------------------------------------------
# scaled_mm end to end


def _operands(rng, M, N, K, fmt_a="e4m3"):
    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt_a]
    a = (torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)) * 4).to(dtype)
    w = (torch.from_numpy(rng.standard_normal((N, K)).astype(np.float32)) * 4).to(torch.float8_e4m3fn)
    sa = torch.from_numpy(rng.uniform(0.01, 10, (M, 1)).astype(np.float32))
    sb = torch.from_numpy(rng.uniform(0.01, 10, (1, N)).astype(np.float32))
    bias = torch.from_numpy(rng.standard_normal(N).astype(np.float32)).to(torch.bfloat16)
    return a, w, sa, sb, bias


def _rowwise(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalPresetWarning)
        return mmaemu.scaled_mm(*args, **kwargs)


E2E_SHAPES = [(64, 3072, 16), (65, 3072, 16), (960, 960, 16), (1088, 960, 16), (16, 48, 208), (48, 16, 336)]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "slow"])
@pytest.mark.parametrize("M,N,K", E2E_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in E2E_SHAPES])
def test_scaled_mm_is_the_oracle_epilogue_of_the_accumulator(M, N, K, fast):
    rng = np.random.default_rng(M * 7 + N + K)
    a, w, sa, sb, bias = _operands(rng, M, N, K, "e5m2" if M % 2 else "e4m3")
    with_bias = N % 3 == 0
    out = _rowwise(a, w.t(), sa, sb, bias=bias if with_bias else None, out_dtype=torch.bfloat16,
                   use_fast_accum=fast)
    acc = mmaemu.accumulate(a, w, use_fast_accum=fast, splitk=1).numpy().view(np.uint32)
    got = out.view(torch.uint16).numpy()
    xs, ws = sa.numpy().view(np.uint32).reshape(-1), sb.numpy().view(np.uint32).reshape(-1)
    bias_bits = bias.view(torch.uint16).numpy() if with_bias else None
    picks = rng.choice(M * N, size=min(M * N, 25_000), replace=False)  # > 100,000 outputs per mode in all
    transposed = oracle.rowwise_runs_transposed(M, N)
    for i in picks:
        m, n = divmod(int(i), N)
        want = oracle.rowwise_epilogue(int(acc[m, n]), int(xs[m]), int(ws[n]),
                                       None if bias_bits is None else int(bias_bits[n]), transposed)
        assert int(got[m, n]) == want, (m, n)


@pytest.mark.parametrize("M,N", [(64, 3072), (65, 3072)], ids=["x-first", "w-first"])
def test_scaled_mm_multiplies_the_scales_in_the_dispatched_order(M, N):
    """Through scaled_mm (the kept plan's compiled row-wise call), scales whose order decides the result: a huge
    scale_a (about 2**126) and a tiny scale_b (about 2**-126), so that ``acc * scale_a`` first overflows to Inf
    where ``acc * scale_b`` first stays finite. Every sampled output is the oracle's for the order the kernel's
    dispatch gives the shape (64 x 3072: scale_a first; 65 x 3072: transposed, scale_b first), and most differ
    from the other order's, so a swapped order fails."""
    rng = np.random.default_rng(M * 3 + N)
    K = 16
    a, w, _, _, _ = _operands(rng, M, N, K)
    sa = torch.from_numpy((rng.uniform(1.0, 2.0, (M, 1)) * 2.0 ** 126).astype(np.float32))
    sb = torch.from_numpy((rng.uniform(1.0, 2.0, (1, N)) * 2.0 ** -126).astype(np.float32))
    got = _rowwise(a, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True).view(torch.uint16).numpy()
    acc = mmaemu.accumulate(a, w, use_fast_accum=True, splitk=1).numpy().view(np.uint32)
    xs, ws = sa.numpy().view(np.uint32).reshape(-1), sb.numpy().view(np.uint32).reshape(-1)
    transposed = oracle.rowwise_runs_transposed(M, N)
    assert transposed is (M == 65)
    differ = 0
    picks = rng.choice(M * N, size=4000, replace=False)
    for i in picks:
        m, n = divmod(int(i), N)
        args = (int(acc[m, n]), int(xs[m]), int(ws[n]), None)
        assert int(got[m, n]) == oracle.rowwise_epilogue(*args, transposed), (m, n)
        differ += oracle.rowwise_epilogue(*args, not transposed) != int(got[m, n])
    assert differ > picks.size // 2, f"only {differ} outputs tell the two orders apart"


def test_accumulator_chunks_against_the_oracle():
    """The row-wise accumulator is the hopper chain: against the oracle's unsplit fast / slow (c.1, c.2)."""
    rng = np.random.default_rng(RNG_SEED)
    a, w, *_ = _operands(rng, 4, 8, 336)
    preset = oracle.PRESETS["hopper"]
    codes_a, codes_w = a.view(torch.uint8).tolist(), w.view(torch.uint8).tolist()
    for fast in (True, False):
        acc = mmaemu.accumulate(a, w, use_fast_accum=fast, splitk=1).numpy().view(np.uint32)
        assert acc.tolist() == oracle.accumulate(codes_a, codes_w, "e4m3", "e4m3", preset, fast)


def test_accumulator_chunks_against_mmasim():
    """MMA-Sim's Hopper wgmma k32 (external oracle): fast = one chain of k32 instructions over all of K; slow =
    128-k chunks, each a chain from zero, added in fp32 from +0 in k order (K = 336: a ragged last chunk)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from mmasim.nv_ptx import sim
    except Exception as exc:  # same rule as tests/test_mmasim_oracle.py
        if os.environ.get("MMAEMU_TEST_REQUIRE_MMASIM") == "1":
            pytest.fail(f"MMA-Sim required but not available: {exc}")
        pytest.skip(f"MMA-Sim is not available: {exc}")
    rng = np.random.default_rng(RNG_SEED + 1)
    M, N, K = 8, 16, 336
    a, w, *_ = _operands(rng, M, N, K)
    model = sim.WGMMA("Hopper", "m64n8k32.f32.e4m3.e4m3")
    padded = -(-K // 32) * 32
    rows_a = torch.zeros((M * N, padded), dtype=torch.uint8)
    rows_b = torch.zeros((M * N, padded), dtype=torch.uint8)
    rows_a[:, :K] = a.view(torch.uint8).repeat_interleave(N, dim=0)
    rows_b[:, :K] = w.view(torch.uint8).repeat(M, 1)
    ta, tb = rows_a.view(torch.float8_e4m3fn), rows_b.view(torch.float8_e4m3fn)

    def chain(k0, k1):
        c = torch.zeros(M * N, dtype=torch.float32)
        for k in range(k0, k1, 32):
            c = model.dpa(ta[:, k:k + 32], tb[:, k:k + 32], c)
        return c

    fast = chain(0, padded).numpy().view(np.uint32)
    slow = np.zeros(M * N, np.uint32)
    for k0 in range(0, padded, 128):
        part = chain(k0, min(k0 + 128, padded)).numpy().view(np.uint32)
        slow = np.array([oracle.fp32_add(int(s), int(p)) for s, p in zip(slow, part)], np.uint32)
    for use_fast, want in ((True, fast), (False, slow)):
        got = mmaemu.accumulate(a, w, use_fast_accum=use_fast, splitk=1).numpy().view(np.uint32).reshape(-1)
        assert got.tolist() == want.tolist(), "fast" if use_fast else "slow"


# ----------------------------------------------------------------------------------------------------------------
# Validation, platforms, explain, warnings


def _call(**changes):
    rng = np.random.default_rng(3)
    a, w, sa, sb, bias = _operands(rng, 32, 48, 64)
    args = dict(input=a, mat2=w.t(), scale_a=sa, scale_b=sb, bias=None, out_dtype=torch.bfloat16)
    args.update(changes)
    return args


def _explain(**changes):
    return mmaemu.explain(**_call(**changes))


def _validation(**changes):
    return _explain(**changes).validation


def test_explain_reports_the_kernel_and_no_split():
    plan = _explain()
    assert plan.validation == "ok"
    assert plan.kernel == "cutlass rowwise"
    assert plan.split.S == 1 and "no split-K" in plan.split.note and "persistent scheduler" in plan.split.note
    assert any("experimental" in text for text in plan.warnings)


def test_maturity_warning_is_emitted():
    mmaemu.warn.reset()
    with pytest.warns(ExperimentalPresetWarning, match="row-wise scaled_mm"):
        mmaemu.scaled_mm(**_call())


def test_ws0_profile_computes_the_same_bits():
    args = _call(bias=torch.ones(48, dtype=torch.bfloat16))
    assert torch.equal(_rowwise(**args).view(torch.uint16), _rowwise(**args, profile="hopper-ws0").view(torch.uint16))


def _column_major(t):
    return t.t().contiguous().t()


def test_torch_checks_in_order():
    rng = np.random.default_rng(5)
    a, w, sa, sb, bias = _operands(rng, 32, 48, 64)
    e5m2_w = w.to(torch.float8_e5m2)
    cases = [
        (dict(out_dtype=torch.float16), "Only bf16 high precision output types"),
        (dict(out_dtype=torch.float32, mat2=e5m2_w.t()), "Only bf16 high precision output types"),
        (dict(mat2=e5m2_w.t(), input=_column_major(a)), "b.dtype() == at::kFloat8_e4m3fn"),
        (dict(input=_column_major(a)), "a.stride(1) == 1"),
        (dict(input=torch.zeros(32, 128, dtype=torch.float8_e4m3fn)[:, ::2]), "a.stride(1) == 1"),
        (dict(mat2=w.t().contiguous()), "b.stride(0) == 1"),
        (dict(bias=bias.reshape(1, 48)), "bias->dim() == 1"),
        (dict(bias=torch.ones(96, dtype=torch.bfloat16)[::2]), "bias->stride(0) == 1"),
        (dict(out=_column_major(torch.empty(32, 48, dtype=torch.bfloat16))), "out.stride(1) == 1"),
    ]
    for changes, text in cases:
        validation = _validation(**changes)
        assert validation[0] == "ReferenceRejectsError" and text in validation[1], (changes.keys(), validation)


def test_e5m2_input_with_e4m3_weight_computes():
    args = _call(input=_call()["input"].to(torch.float8_e5m2))
    assert _explain(**args).validation == "ok"
    assert _rowwise(**args).dtype == torch.bfloat16


@pytest.mark.parametrize("profile", ["ada", "ada-ws0", "ada-te", "hopper-te", "hopper-experimental",
                                     "tcgen05-f8f6f4-experimental"])
def test_other_profiles_refuse_rowwise(profile):
    validation = _validation(profile=profile)
    assert validation[0] == "UnsupportedFeatureError" and "row-wise" in validation[1], validation
    if profile.startswith("ada"):
        assert "stream-K" in validation[1] and "Hopper model is not used" in validation[1]


def test_ada_refusal_comes_after_torch_checks():
    assert _validation(profile="ada", out_dtype=torch.float16)[0] == "ReferenceRejectsError"


def test_undefined_tma_cases_are_refused():
    a = _call()["input"]
    storage = torch.empty(32 * 64 + 8, dtype=torch.uint8)
    shifted = storage[8:8 + 32 * 64].view(torch.float8_e4m3fn).view(32, 64)
    shifted.copy_(a)
    assert _validation(input=shifted)[0] == "UnsupportedFeatureError"
    padded = torch.zeros(32, 72, dtype=torch.float8_e4m3fn)[:, :64]
    assert _validation(input=padded)[0] == "UnsupportedFeatureError"


def test_split_requests_are_refused():
    with pytest.raises(UnsupportedFeatureError, match="never splits K"):
        _rowwise(**_call(), splitk=(2, "contiguous"))
    assert _rowwise(**_call(), splitk=1).shape == (32, 48)


def test_grad_is_refused():
    args = _call()
    args["scale_a"] = args["scale_a"].clone().requires_grad_(True)
    assert _validation(**args)[0] == "UnsupportedFeatureError"


def test_zero_size_returns_zeros():
    args = _call()
    args["input"], args["scale_a"] = args["input"][:0], args["scale_a"][:0]
    assert _rowwise(**args).shape == (0, 48)


def test_tensorwise_calls_are_unchanged_in_scope():
    """A tensor-wise call with a bias is still refused as out of scope (only row-wise calls model the bias)."""
    args = _call(scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0), bias=torch.ones(48, dtype=torch.bfloat16))
    assert _validation(**args)[0] == "UnsupportedFeatureError"


# ----------------------------------------------------------------------------------------------------------------
# CUDA simulator


_SIM_WORKER = r"""
import numpy as np
from mmaemu.cpu import accumulate_codes, rowwise_epilogue_codes
from mmaemu.cuda.dispatch import engine
from mmaemu.model.presets import HOPPER
import test_rowwise as t

rng = np.random.default_rng(7)
acc = t.adversarial_accumulators(rng, 8 * 20).reshape(8, 20)
xs, ws, bias = t.adversarial_scales(rng, 8), t.adversarial_scales(rng, 20), t.adversarial_biases(rng, 20)
for b, x_first in ((bias, True), (None, False)):
        want = rowwise_epilogue_codes(acc.view(np.float32), xs, ws, b, x_first)
        got = engine.rowwise_epilogue_numpy(acc.view(np.float32), xs, ws, b, x_first)
        assert (got == want).all(), ("epilogue", b is None, x_first)
a = rng.integers(0, 256, (3, 208), dtype=np.uint8)
w = rng.integers(0, 256, (4, 208), dtype=np.uint8)
for fast in (True, False):
    want = accumulate_codes(a, w, "e5m2", "e4m3", HOPPER, fast)
    got = engine.accumulate_numpy("simple", a, w, "e5m2", "e4m3", HOPPER, fast)
    assert (got.view(np.uint32) == want.view(np.uint32)).all(), ("simple", fast)
print("ok")
"""


@pytest.mark.sim
@pytest.mark.subprocess
def test_cuda_simple_and_rowwise_epilogue_under_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tests_dir, env.get("PYTHONPATH", "")) if p)
    result = subprocess.run([sys.executable, "-c", _SIM_WORKER], env=env, capture_output=True, text=True,
                            timeout=600, cwd=tests_dir)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


# ----------------------------------------------------------------------------------------------------------------
# torchao's row-wise quantiser


def test_quantize_rowwise_scales_and_codes():
    import math

    from mmaemu.quantize import quantize, quantize_rowwise, rowwise_scale

    rng = np.random.default_rng(11)
    x = torch.from_numpy((rng.standard_normal((64, 96)) * np.exp2(rng.integers(-30, 30, (64, 1)))).astype(np.float32))
    x[3] = 0.0  # amax 0: the scale comes from torchao's EPS
    for power_2 in (True, False):
        q, s = quantize_rowwise(x, "e4m3", round_scales_to_power_of_2=power_2)
        assert q.dtype == torch.float8_e4m3fn and s.shape == (64, 1) and s.dtype == torch.float32
        for r in range(64):
            amax = max(float(x[r].abs().max()), 1e-12)
            exact = float(np.float32(448.0 / amax))
            want = math.ldexp(1.0, math.frexp(exact)[1] - 1) if power_2 else exact
            assert float(s[r, 0]) == want, (r, power_2)
            # the cast is the saturating round to nearest of fp32(x) * s (mmaemu.quantize's own cast)
            assert torch.equal(q[r].view(torch.uint8), quantize(x[r], float(s[r, 0]), "e4m3").view(torch.uint8))
    assert torch.equal(rowwise_scale(x.bfloat16()), rowwise_scale(x.bfloat16().float()))


def test_quantized_linear_runs_rowwise():
    from mmaemu.quantize import quantize_rowwise

    rng = np.random.default_rng(12)
    x = torch.from_numpy(rng.standard_normal((32, 64)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((48, 64)).astype(np.float32))
    qx, sx = quantize_rowwise(x)
    qw, sw = quantize_rowwise(w)
    out = _rowwise(qx, qw.t(), sx.reciprocal(), sw.reciprocal().t(), out_dtype=torch.bfloat16)
    dequantized = (qx.float() / sx) @ (qw.float() / sw).t()  # FP8 rounding of the operands is the only big error
    assert torch.allclose(out.float(), dequantized, rtol=0.02, atol=0.1)


def test_transposed_problem_has_the_same_chains_in_mmasim():
    """The transposed problem multiplies W^T X^T: each output's chain has its operands swapped (E5M2 x E4M3 becomes
    E4M3 x E5M2). MMA-Sim's Hopper wgmma gives the same chain either way (fast and 128-k chunks alike)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from mmasim.nv_ptx import sim
    except Exception as exc:
        if os.environ.get("MMAEMU_TEST_REQUIRE_MMASIM") == "1":
            pytest.fail(f"MMA-Sim required but not available: {exc}")
        pytest.skip(f"MMA-Sim is not available: {exc}")
    rng = np.random.default_rng(RNG_SEED + 2)
    cases, K = 4096, 128
    a = torch.from_numpy(rng.integers(0, 256, (cases, K), dtype=np.uint8))
    b = torch.from_numpy(rng.integers(0, 256, (cases, K), dtype=np.uint8))
    a5, b4 = a.view(torch.float8_e5m2), b.view(torch.float8_e4m3fn)
    straight = sim.WGMMA("Hopper", "m64n8k32.f32.e5m2.e4m3")
    swapped = sim.WGMMA("Hopper", "m64n8k32.f32.e4m3.e5m2")
    c1 = c2 = torch.zeros(cases, dtype=torch.float32)
    for k in range(0, K, 32):
        c1 = straight.dpa(a5[:, k:k + 32], b4[:, k:k + 32], c1)
        c2 = swapped.dpa(b4[:, k:k + 32], a5[:, k:k + 32], c2)
    assert torch.equal(c1.view(torch.int32), c2.view(torch.int32))

"""Transformer Engine's per-tensor quantisation (mmaemu.quantize): the cast, amax and the scaling factors.

Oracles: torch's own float32 -> float8 casts where they agree with TE's saturating cast (values inside the
format's range), the 256 codes of each format, and edge cases worked out by hand (ties, subnormals, saturation,
NaN, the fp32 rounding of x * scale).
"""

import math

import numpy as np
import pytest
import torch

import mmaemu
from mmaemu.quantize import (
    FP8_MAX,
    amax_scale,
    compute_amax,
    dequantize,
    quantize,
    quantize_current,
    quantize_e4m3,
    quantize_e5m2,
    quantize_rowwise,
    rowwise_scale,
    scale_from_amax,
    scale_inv,
)

DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FLT_MAX = float(np.finfo(np.float32).max)
INF, NAN = float("inf"), float("nan")


def codes(q):
    return q.view(torch.uint8).tolist()


def f32(value):
    return float(np.float32(value))


# ------------------------------------------------------------------------------------------------------------------
# The cast


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_in_range_values_match_torch_cast(fmt, dtype):
    g = torch.Generator().manual_seed(7)
    n = 50_000
    magnitude = torch.exp2(torch.randint(-28, 16, (n,), generator=g).float())
    x = (torch.randn(n, generator=g) * magnitude).clamp(-FP8_MAX[fmt], FP8_MAX[fmt]).to(dtype)
    x = x[torch.isfinite(x)]
    expected = x.float().to(DTYPE[fmt])  # in range, torch's cast is RNE like TE's
    assert torch.equal(quantize(x, 1.0, fmt).view(torch.uint8), expected.view(torch.uint8))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_every_code_round_trips(fmt):
    all_codes = torch.arange(256, dtype=torch.uint8)
    values = all_codes.view(DTYPE[fmt]).float()
    got = quantize(values, 1.0, fmt).view(torch.uint8)
    finite = torch.isfinite(values)
    assert torch.equal(got[finite], all_codes[finite])
    assert set(got[torch.isnan(values)].tolist()) == {0x7F}
    if fmt == "e5m2":  # +-inf saturates to +-57344
        assert got[values == INF].tolist() == [0x7B] and got[values == -INF].tolist() == [0xFB]


def test_e4m3_hand_checked_cases():
    cases = [
        (1.0625, 0x38),         # tie between 1 (0x38) and 1.125 (0x39): to even
        (1.1875, 0x3A),         # tie between 1.125 and 1.25: to even (0x3A)
        (-1.0625, 0xB8),
        (2.0 ** -10, 0x00),     # half the smallest subnormal: tie to zero
        (-(2.0 ** -10), 0x80),  # ... keeping the sign
        (3 * 2.0 ** -10, 0x02),  # 1.5 x 2^-9: tie between 0x01 and 0x02 -> even
        (5 * 2.0 ** -10, 0x02),  # 2.5 x 2^-9 -> 0x02
        (2.0 ** -9, 0x01),
        (-0.0, 0x80),
        (0.0, 0x00),
        (448.0, 0x7E),
        (464.0, 0x7E),          # tie between 448 and the (non-existent) 480: saturates
        (470.0, 0x7E),          # torch 2.7.1's own cast would give NaN here; TE saturates
        (1e30, 0x7E),
        (INF, 0x7E),
        (-INF, 0xFE),
        (NAN, 0x7F),
        (-NAN, 0x7F),           # canonical NaN, sign dropped
        (1e-45, 0x00),          # fp32 subnormal input
    ]
    x = torch.tensor([v for v, _ in cases], dtype=torch.float32)
    assert codes(quantize_e4m3(x, 1.0)) == [c for _, c in cases]


def test_e5m2_hand_checked_cases():
    cases = [
        (57344.0, 0x7B), (61440.0, 0x7B), (1e10, 0x7B), (INF, 0x7B), (-INF, 0xFB), (NAN, 0x7F),
        (2.0 ** -16, 0x01), (2.0 ** -17, 0x00), (3 * 2.0 ** -17, 0x02), (-(2.0 ** -17), 0x80),
        (1.125, 0x3C),  # tie between 1 (0x3C) and 1.25 (0x3D): even
        (1.375, 0x3E),  # tie between 1.25 (0x3D) and 1.5 (0x3E): even
    ]
    x = torch.tensor([v for v, _ in cases], dtype=torch.float32)
    assert codes(quantize_e5m2(x, 1.0)) == [c for _, c in cases]


def test_the_scale_multiplication_is_rounded_to_fp32_first():
    # x * s = 1.0625 + 2^-27 - 2^-46 exactly: a single rounding to E4M3 would give 1.125 (0x39), but TE rounds
    # the product to fp32 first (1.0625, a tie) and then to even: 1.0 (0x38).
    x = torch.tensor([1 + 2.0 ** -23])
    s = 1.0625 - 2.0 ** -23
    assert f32(float(x) * s) == 1.0625
    assert codes(quantize_e4m3(x, s)) == [0x38]
    # Saturation applies to the scaled value.
    assert codes(quantize_e4m3(torch.tensor([1.0, -1.0, 0.5]), 600.0)) == [0x7E, 0xFE, 0x79]  # 300 -> 288


def test_python_scales_are_rounded_to_fp32_and_tensors_must_be_fp32():
    x = torch.tensor([1.0])
    assert codes(quantize_e4m3(x, 0.1)) == codes(quantize_e4m3(x, torch.tensor(0.1)))
    with pytest.raises(TypeError, match="fp32"):
        quantize_e4m3(x, torch.tensor(0.1, dtype=torch.float64))
    with pytest.raises(ValueError, match="one-element"):
        quantize_e4m3(x, torch.ones(2))
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        quantize_e4m3(x.double(), 1.0)
    with pytest.raises(ValueError, match="fmt"):
        quantize(x, 1.0, "e3m4")


def test_shape_device_and_dtype_are_kept():
    x = torch.randn(2, 3, 5, dtype=torch.bfloat16)
    q = quantize(x, 3.0, torch.float8_e5m2)
    assert q.shape == x.shape and q.dtype == torch.float8_e5m2 and q.device == x.device
    assert not quantize_e4m3(x.requires_grad_() if x.is_floating_point() else x, 1.0).requires_grad


def test_dequantize_multiplies_by_the_inverse_scale_in_fp32():
    q = quantize_e4m3(torch.tensor([1.0, -2.5, 448.0]), 1.0)
    assert dequantize(q, 0.5).tolist() == [0.5, -1.25, 224.0]
    assert dequantize(q, 2.0, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_top_level_names():
    assert mmaemu.quantize_e4m3 is quantize_e4m3 and mmaemu.quantize_e5m2 is quantize_e5m2


# ------------------------------------------------------------------------------------------------------------------
# amax and scaling factors


def test_amax_ignores_nan_keeps_inf_and_is_zero_when_empty():
    assert float(compute_amax(torch.tensor([1.0, -3.0, NAN, 2.0]))) == 3.0
    assert float(compute_amax(torch.tensor([1.0, -INF]))) == INF
    assert float(compute_amax(torch.tensor([NAN, NAN]))) == 0.0
    assert float(compute_amax(torch.empty(0, 4))) == 0.0
    amax = compute_amax(torch.tensor([-0.5], dtype=torch.bfloat16))
    assert amax.dtype == torch.float32 and amax.shape == () and float(amax) == 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_amax_is_torchs_reduction(dtype):
    # the CPU path reads the amax off the bits; torch's abs / where / max (the path of other devices) is the oracle
    rng = np.random.default_rng(7)
    info = torch.finfo(dtype)
    specials = torch.tensor([0.0, -0.0, INF, -INF, NAN, -NAN, info.max, -info.max, info.tiny, -info.tiny,
                             info.tiny / 4, -info.tiny / 8, info.eps], dtype=dtype)
    samples = [specials, torch.tensor([NAN, -NAN], dtype=dtype), torch.tensor([-0.0, -0.0], dtype=dtype),
               torch.tensor([-0.0, NAN], dtype=dtype), torch.tensor([-INF, NAN, 1.0], dtype=dtype)]
    for _ in range(20):  # every bit pattern equally likely (NaNs, subnormals and both signs included)
        bits = rng.integers(0, 1 << (8 * info.bits // 8), 257)
        view = torch.int32 if dtype == torch.float32 else torch.int16
        samples.append(torch.from_numpy(bits.astype(np.uint32 if view == torch.int32 else np.uint16)
                                        .view(np.int32 if view == torch.int32 else np.int16)).view(dtype))
    samples.append(torch.randn(64, 576).to(dtype)[:, ::3])  # not contiguous, above torch's parallel grain
    for x in samples:
        magnitude = x.abs()
        want = torch.where(torch.isnan(magnitude), torch.zeros((), dtype=dtype), magnitude).max().to(torch.float32)
        got = compute_amax(x)
        assert got.dtype == torch.float32 and got.shape == ()
        assert got.view(torch.int32).item() == want.view(torch.int32).item(), (x, got, want)


def test_delayed_scaling_factor():
    assert scale_from_amax(3.0) == f32(np.float32(448.0) / np.float32(3.0))
    assert scale_from_amax(3.0, "e5m2") == f32(np.float32(57344.0) / np.float32(3.0))
    assert scale_from_amax(3.0, margin=2) == f32(np.float32(112.0) / np.float32(3.0))
    # amax 0 or non-finite: TE keeps the previous scale (1.0 at the start)
    for amax in (0.0, INF, NAN, -1.0):
        assert scale_from_amax(amax) == 1.0
        assert scale_from_amax(amax, previous_scale=7.5) == 7.5
    assert scale_from_amax(1e-40) == FLT_MAX  # TE 2.x guards the overflow
    assert scale_from_amax(torch.tensor(2.0)).dtype == torch.float32


def test_current_scaling_factor():
    assert scale_from_amax(3.0, recipe="current") == scale_from_amax(3.0)
    for amax in (0.0, INF, NAN):
        assert scale_from_amax(amax, recipe="current") == 1.0
    assert scale_from_amax(1e-40, recipe="current") == FLT_MAX
    assert scale_from_amax(0.0, recipe="current", epsilon=0.5) == 896.0
    assert scale_from_amax(3.0, recipe="current", power_2=True) == 128.0  # 149.33 -> 2^7
    with pytest.raises(ValueError, match="no margin"):
        scale_from_amax(3.0, margin=1, recipe="current")
    with pytest.raises(ValueError, match="integer"):
        scale_from_amax(3.0, margin=0.5)
    with pytest.raises(ValueError, match="recipe"):
        scale_from_amax(3.0, recipe="mxfp8")


def test_amax_scale_of_a_tensor():
    x = torch.tensor([[0.25, -7.0], [NAN, 1.0]])
    s = amax_scale(x)
    assert s.dtype == torch.float32 and s.shape == () and float(s) == 64.0
    assert float(amax_scale(x, "e5m2", 1, recipe="delayed")) == f32(np.float32(28672.0) / np.float32(7.0))
    assert float(amax_scale(torch.zeros(3))) == 1.0


def test_scale_inv_is_one_correctly_rounded_division():
    g = torch.Generator().manual_seed(3)
    scales = torch.exp2(torch.randn(2000, generator=g) * 20)
    expected = torch.tensor([1.0 / float(s) for s in scales.double()], dtype=torch.float64).float()
    got = torch.stack([scale_inv(s) for s in scales])
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))
    assert scale_inv(448.0 / 3.0) == f32(np.float32(1.0) / np.float32(448.0 / 3.0))
    assert scale_inv(0.0) == INF and scale_inv(INF) == 0.0
    assert isinstance(scale_inv(2.0), float) and isinstance(scale_inv(torch.tensor(2.0)), torch.Tensor)


def test_te_style_round_trip_error_is_within_half_an_fp8_step():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4096, generator=g) * 5
    s = amax_scale(x)
    back = dequantize(quantize_e4m3(x, s), scale_inv(s))
    # relative step of E4M3 normals is 2^-3; half of it bounds the error (plus fp32 noise)
    normal = (x.abs() * float(s)) >= 2.0 ** -6
    rel = ((back - x).abs() / x.abs())[normal]
    assert float(rel.max()) <= 2.0 ** -4 * (1 + 1e-6)
    assert math.isclose(float(back.abs().max()), float(x.abs().max()), rel_tol=1e-6)


def test_every_helper_refuses_flush_to_zero_mode_as_the_cast_does():
    """In flush-to-zero mode the helpers would flush subnormal scales, amaxes and products (2**-140 * 2**-10 is a
    subnormal product): each refuses with the cast's error, computing nothing."""
    from mmaemu.errors import MmaemuError

    tiny = torch.tensor([2.0 ** -140, -3.0], dtype=torch.float32)
    q = quantize_e4m3(torch.tensor([1.0, 2.0 ** -9]), 1.0)
    calls = {
        "quantize_e4m3": lambda: quantize_e4m3(tiny, 1.0),
        "scale_inv": lambda: scale_inv(torch.tensor(2.0 ** 127)),
        "scale_inv(float)": lambda: scale_inv(2.0 ** 127),
        "dequantize": lambda: dequantize(q, 2.0 ** -140),
        "compute_amax": lambda: compute_amax(tiny[:1]),
        "amax_scale": lambda: amax_scale(tiny[:1]),
        "scale_from_amax": lambda: scale_from_amax(2.0 ** -140, recipe="current"),
        "rowwise_scale": lambda: rowwise_scale(tiny.reshape(1, 2)),
        "quantize_rowwise": lambda: quantize_rowwise(tiny.reshape(1, 2))[0],
        "quantize_current": lambda: quantize_current(tiny)[0],
    }
    expected = {name: call() for name, call in calls.items()}
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        messages = {}
        for name, call in calls.items():
            with pytest.raises(MmaemuError, match=r"set_flush_denormal\(False\)") as info:
                call()
            messages[name] = str(info.value)
    finally:
        torch.set_flush_denormal(False)
    assert len(set(messages.values())) == 1, messages  # one check, one error
    for name, call in calls.items():  # and out of that mode, the same values as before
        got, want = call(), expected[name]
        if isinstance(want, torch.Tensor):
            assert torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), name
        else:
            assert got == want, name


# ------------------------------------------------------------------------------------------------------------------
# The compiled CPU cast (mmaemu.cpu.cast) against the torch operations kept for GPU tensors


def adversarial_fp32():
    """fp32 values at the casts' edges: signed zeros, fp32 subnormals, FP8 subnormals and the normal boundary,
    the ties and their neighbours (one fp32 ulp either side) around every E4M3 and E5M2 value, values next to
    the saturation bounds, the largest finite fp32, infinities and NaNs of both signs, and random bit patterns."""
    bits = [0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000,
            0xFFC00000, 0x7F800001]
    for fmt in ("e4m3", "e5m2"):
        values = torch.arange(256, dtype=torch.uint8).view(DTYPE[fmt]).to(torch.float32)
        finite = values[torch.isfinite(values)].numpy().astype(np.float64)
        finite = np.unique(finite)
        ties = (finite[1:] + finite[:-1]) / 2  # exact in fp32: each lies between two neighbours of <= 4 bits
        for v in np.concatenate([finite, ties, [FP8_MAX[fmt] * 1.0625, FP8_MAX[fmt] * 1.125]]).astype(np.float32):
            b = int(np.array([v], np.float32).view(np.uint32)[0])
            bits += [b - 1, b, b + 1, (b - 1) | 0x80000000, b | 0x80000000, (b + 1) | 0x80000000]
    rng = np.random.default_rng(11)
    bits += rng.integers(0, 2**32, 20_000, dtype=np.uint64).tolist()
    bits = [b & 0xFFFFFFFF for b in bits]  # b - 1 of +0 wraps to a NaN pattern: kept, one more NaN
    return torch.from_numpy(np.array(bits, np.uint64).astype(np.uint32).view(np.int32)).view(torch.float32)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [1.0, 0.5, 3.0, 2.0**-20, 2.0**20, f32(1 / 3), -2.0, 0.0, INF, NAN])
def test_compiled_cpu_cast_is_the_torch_operations(fmt, dtype, scale):
    from mmaemu.quantize import _round_to_fp8

    x = adversarial_fp32()
    if dtype != torch.float32:
        with np.errstate(all="ignore"):
            x = x.to(dtype)  # rounds: the cast then sees that dtype's values (and its own ties, subnormals)
    got = quantize(x, scale, fmt)
    want = _round_to_fp8(x.to(torch.float32) * torch.tensor(f32(scale)), fmt)
    assert got.dtype == DTYPE[fmt] and got.shape == x.shape
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_compiled_cpu_cast_keeps_shape_and_reads_strided_inputs():
    x = torch.randn(6, 8).t()  # not contiguous
    got = quantize(x, 7.0, "e4m3")
    from mmaemu.quantize import _round_to_fp8

    assert got.shape == (8, 6)
    assert torch.equal(got.view(torch.uint8), _round_to_fp8(x * torch.tensor(7.0), "e4m3").view(torch.uint8))
    assert quantize(torch.tensor(2.0), 1.0, "e4m3").shape == ()


# The compiled CPU amax (mmaemu.cpu.cast.amax_fp32) against the torch operations kept for GPU tensors


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_compiled_cpu_amax_is_the_torch_operations(dtype):
    from mmaemu.quantize import _amax_torch

    x = adversarial_fp32()
    with np.errstate(all="ignore"):
        x = x.to(dtype)
    finite = x[~torch.isnan(x)]
    rng = np.random.default_rng(5)
    cases = [x, finite, finite[torch.isfinite(finite)], x[torch.isnan(x)], -finite[:100], x[:1], x.reshape(-1, 4).t()]
    for _ in range(20):  # random subsets: every position of the largest value in some order
        cases.append(x[torch.from_numpy(rng.permutation(x.numel())[: int(rng.integers(1, x.numel()))])])
    for case in cases:
        got, want = compute_amax(case), _amax_torch(case)
        assert got.dtype == torch.float32 and got.shape == ()
        assert got.view(torch.int32).item() == want.view(torch.int32).item()


def test_compiled_cpu_amax_and_cast_of_large_tensors_cut_into_tasks():
    """Inputs of several tasks (mmaemu.cpu.cast's spans start inside the array): the largest magnitude placed in
    each task's span in turn, NaN around it; the cast of the same values against the torch operations."""
    from mmaemu.cpu import threads
    from mmaemu.cpu.cast import AMAX_WORK, CAST_WORK, amax_fp32
    from mmaemu.quantize import _amax_torch, _round_to_fp8

    n = 3 * threads.MIN_TASK_WORK // min(AMAX_WORK, CAST_WORK) + 17  # at least 3 tasks of either loop
    assert len(threads.job_ranges(n, AMAX_WORK, 2)) >= 3 and len(threads.job_ranges(n, CAST_WORK, 2)) >= 3
    rng = np.random.default_rng(9)
    base = rng.standard_normal(n).astype(np.float32)
    base[rng.integers(0, n, 1000)] = np.nan
    for position in (0, n // 3, n // 2 + 1, n - 1):
        values = base.copy()
        values[position] = -1000.0
        x = torch.from_numpy(values)
        assert float(amax_fp32(values)) == 1000.0
        assert compute_amax(x).item() == _amax_torch(x).item() == 1000.0
    x = torch.from_numpy(base * np.float32(50))
    assert torch.equal(quantize(x, 1.0, "e4m3").view(torch.uint8),
                       _round_to_fp8(x * torch.tensor(1.0), "e4m3").view(torch.uint8))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_current_scaling_in_one_call_is_amax_scale_then_the_cast(fmt, dtype):
    """quantize_current (mmaemu.cpu.cast.current_scaling_fp8: amax, scale, inverse and cast in one compiled call)
    against amax_scale, quantize and scale_inv: every amax rule (0, only NaN, Inf, a subnormal amax whose quotient
    overflows to the largest fp32 value, the largest finite fp32), the adversarial values, strided and 0-dim
    inputs, and an input of several tasks (those three functions)."""
    from mmaemu.cpu import threads
    from mmaemu.cpu.cast import CAST_WORK, fits_one_pass

    x = adversarial_fp32()
    with np.errstate(all="ignore"):
        x = x.to(dtype)
    finite = x[torch.isfinite(x)]
    rng = np.random.default_rng(3)
    big = torch.from_numpy(rng.standard_normal(2 * 262_144 + 5).astype(np.float32)).to(dtype)
    tiny = torch.tensor([2.0 ** -149, -0.0], dtype=torch.float32).to(dtype)  # bf16/fp16: 0 or the smallest
    pairs = finite[: finite.numel() // 2 * 2].reshape(-1, 2).t()  # strided
    cases = [x, finite, pairs, x[torch.isnan(x)], torch.zeros(5, 3, dtype=dtype), tiny,
             torch.tensor([FLT_MAX, -1.0]).to(dtype), finite * 2.0 ** -100, finite[:1].reshape(()), big]
    cases += [finite[torch.from_numpy(rng.permutation(finite.numel())[:700])] * float(2.0 ** rng.integers(-30, 30))
              for _ in range(10)]
    assert not fits_one_pass(big.numel()) and fits_one_pass(x.numel())
    for size in (1, 1000, 262_143, 262_144, 262_145, 1 << 20):  # one pass: where quantize_fp8 makes one task
        for n_threads in (1, 2, 3, 8):
            one_task = len(threads.job_ranges(size, CAST_WORK, n_threads)) == 1
            assert fits_one_pass(size) == one_task, (size, n_threads)
    for case in cases:
        q, s_inv = quantize_current(case, fmt)
        scale = amax_scale(case, fmt)
        want_q, want_inv = quantize(case, scale, fmt), scale_inv(scale)
        assert q.dtype == DTYPE[fmt] and q.shape == case.shape
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
        assert s_inv.dtype == torch.float32 and s_inv.shape == ()
        assert s_inv.view(torch.int32).item() == want_inv.view(torch.int32).item()
    largest = quantize_current(torch.tensor([2.0 ** -149, 1e-45]), fmt)[1]  # 448 / 2**-149 overflows
    assert largest.item() == f32(1 / FLT_MAX)


# The compiled CPU row-wise cast (mmaemu.quantize._rowwise_parts, mmaemu.cpu.cast) against torch's operations


def _rowwise_torch(x, fmt, power_2):
    """torchao's row-wise cast of ``x`` as torch operations (the code of ``quantize_rowwise`` for a tensor the
    compiled CPU path does not take): (codes, scales), or the class of the error raised."""
    from mmaemu.base.gpu_torch_ops import power_of_two_floor
    from mmaemu.quantize import TORCHAO_EPS

    magnitude = torch.abs(x).to(torch.float32) if x.dtype == torch.bfloat16 else torch.abs(x)
    amax = torch.amax(magnitude, dim=-1, keepdim=True).to(torch.float64)
    scale = (FP8_MAX[fmt] / torch.clamp(amax, min=TORCHAO_EPS)).to(torch.float32)
    if power_2:
        try:
            scale = torch.from_numpy(power_of_two_floor(scale.numpy(), rule="r", way_out="w"))
        except mmaemu.UnsupportedFeatureError as error:
            return type(error)
    codes = (x.to(torch.float32) * scale).clamp(min=-FP8_MAX[fmt], max=FP8_MAX[fmt]).to(DTYPE[fmt])
    return codes, scale


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_compiled_rowwise_cast_is_the_torch_operations(fmt, dtype):
    """Rows of the adversarial values (each row's amax set by a random power of two and a random fraction, so
    scales of every binade and fraction), rows of zeros of both signs, of fp32 subnormals (amax below torchao's
    1e-12), and tensors holding an Inf or a NaN (torch's operations then): codes and scales bit for bit, or the
    same refusal, with and without the power-of-two scales."""
    x = adversarial_fp32()
    with np.errstate(all="ignore"):
        x = x.to(dtype)
    rng = np.random.default_rng(17)
    finite = x[torch.isfinite(x)].to(torch.float32)
    cols = 48
    rows = finite[: finite.numel() // cols * cols].reshape(-1, cols)
    multipliers = np.ldexp(rng.uniform(1, 2, (rows.shape[0], 1)), rng.integers(-20, 20, (rows.shape[0], 1)))
    rows = (rows * torch.from_numpy(multipliers.astype(np.float32))).to(dtype)
    rows = rows[torch.isfinite(rows).all(dim=1)]
    zeros = torch.zeros(3, cols, dtype=dtype)
    zeros[1] = -0.0
    tiny = torch.from_numpy(rng.standard_normal((2, cols)).astype(np.float32) * np.float32(2.0**-130)).to(dtype)
    nonfinite = rows[:4].clone()
    nonfinite[1, 3], nonfinite[2, 0], nonfinite[3, 5] = math.nan, -math.inf, -math.nan
    cases = [rows[i:i + 1] for i in range(0, rows.shape[0], 97)] + [rows, zeros, tiny, nonfinite]
    for case in cases:
        for power_2 in (True, False):
            want = _rowwise_torch(case, fmt, power_2)
            try:
                got = quantize_rowwise(case, fmt, round_scales_to_power_of_2=power_2)
                scale = rowwise_scale(case, fmt, round_scales_to_power_of_2=power_2)
            except mmaemu.UnsupportedFeatureError as error:
                assert want is type(error)
                continue
            assert not isinstance(want, type), want
            assert got[0].dtype == DTYPE[fmt] and got[0].shape == case.shape and got[1].shape == (case.shape[0], 1)
            assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
            assert torch.equal(got[1].view(torch.int32), want[1].view(torch.int32))
            assert torch.equal(scale.view(torch.int32), want[1].view(torch.int32))


def test_rowwise_power_of_two_scales_are_power_of_two_floor():
    """The shortcut of ``_power_of_two_scales`` (fraction cleared) against power_of_two_floor, one scale at a time:
    random normal fp32 scales, and fractions on both sides of its threshold and of the refused window."""
    from mmaemu.base.gpu_torch_ops import power_of_two_floor
    from mmaemu.cpu.cast import BELOW_REFUSED_FRACTION as _BELOW_REFUSED_FRACTION
    from mmaemu.quantize import _power_of_two_scales

    rng = np.random.default_rng(23)
    exponents = rng.integers(1, 255, 3000).astype(np.uint32)
    fractions = np.concatenate([rng.integers(0, 1 << 23, 1000),
                                rng.integers(_BELOW_REFUSED_FRACTION - 64, _BELOW_REFUSED_FRACTION + 64, 1000),
                                rng.integers(0x7FFE00, 1 << 23, 1000)]).astype(np.uint32)
    scales = ((exponents << np.uint32(23)) | fractions).view(np.float32)
    shortcuts = 0
    for scale in scales:
        one = np.array([[scale]], np.float32)
        try:
            want = power_of_two_floor(one, rule="r", way_out="w")
        except mmaemu.UnsupportedFeatureError:
            with pytest.raises(mmaemu.UnsupportedFeatureError):
                _power_of_two_scales(one)
            continue
        got = _power_of_two_scales(one)
        assert got.dtype == np.float32 and got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
        shortcuts += int(one.view(np.uint32)[0, 0] & 0x7FFFFF) < _BELOW_REFUSED_FRACTION
    assert shortcuts > 1000  # the shortcut was taken, not only power_of_two_floor

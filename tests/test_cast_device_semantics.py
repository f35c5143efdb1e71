"""The casts compute what torch computes on the reference GPU (issue 28, items 1-4), whatever device the input is on.

Each expected value is derived here from the GPU kernel's formula, written out in numpy fp32 or with math.frexp:
``t / number`` is ``t * fp32(1 / number)`` on CUDA (tests/cuda_torch.py names the kernel), and a power of two from
a floating log2 is the exact one where the log2's rounding cannot matter (and refused where it can). Where the GPU
multiplies by a reciprocal, the test also shows that the CPU kernel's true division gives other bits on some of
its inputs, so that it fails on a CPU-division cast.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cuda_torch import CudaScalarDivision, cuda_inverse

import mmaemu.deepgemm as dg
from mmaemu import block_quantize as bq
from mmaemu.errors import UnsupportedFeatureError
from mmaemu.quantize import quantize, quantize_rowwise, rowwise_scale

F32 = np.float32


def gpu_divide(values, number):
    """``values / number`` as torch's CUDA kernel computes it for fp32 values: values * fp32(1 / number)."""
    return np.asarray(values, F32) * (F32(1.0) / F32(number))


def cpu_divide(values, number):
    """The CPU kernel's correctly rounded fp32 quotient."""
    return np.asarray(values, F32) / F32(number)


def bf16_tensor(seed, shape, spread=0):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape[:1] + (1,)))
    return torch.from_numpy(values.astype(F32)).to(torch.bfloat16)


def fp8_codes(values):
    """torch's cast of fp32 values to float8_e4m3fn (the c10 conversion; CPU and CUDA kernels share it), as uint8."""
    return torch.from_numpy(np.ascontiguousarray(values, F32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def every_positive_bf16():
    """Every positive finite bf16 value (subnormals included), as fp32."""
    return torch.arange(1, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float().numpy()


def every_positive_fp16():
    """Every positive finite fp16 value (subnormals included), as fp32."""
    return torch.arange(1, 0x7C00, dtype=torch.int32).to(torch.int16).view(torch.float16).float().numpy()


def smallest_power_of_two_at_least(v):
    """2**ceil(log2 v) of a positive finite value (math.frexp: v = m * 2**e exactly, m in [0.5, 1))."""
    m, e = math.frexp(float(v))
    return float(v) if m == 0.5 else math.ldexp(1.0, e)


def largest_power_of_two_at_most(v):
    """2**floor(log2 v) of a positive finite value."""
    return math.ldexp(1.0, math.frexp(float(v))[1] - 1)


# ----------------------------------------------------------------------------------------------------------------
# Item 1: DeepGEMM's casts (deep_gemm/utils/math.py of v2.1.1.post3 runs them on the GPU)


def strip_amax(x, rows, cols):
    """max |x| of each rows x cols tile of a 2-D fp32 array whose shape they divide, clamped to fp32(1e-4)."""
    m, n = x.shape
    tiles = np.abs(x).reshape(m // rows, rows, n // cols, cols).max(axis=(1, 3))
    return np.maximum(tiles, F32(1e-4))


def check_deepgemm_cast(x, codes, sf, rows, cols):
    """sf = amax * fp32(1/448) per tile; codes = e4m3(x * fp32(1/sf)); returns how many CPU-division scales differ."""
    values = x.float().numpy()
    amax = strip_amax(values, rows, cols)
    want_sf = gpu_divide(amax, 448.0)
    np.testing.assert_array_equal(sf.numpy().reshape(want_sf.shape), want_sf)
    inverse = np.repeat(np.repeat(F32(1.0) / want_sf, rows, axis=0), cols, axis=1)
    np.testing.assert_array_equal(codes.view(torch.uint8).numpy(), fp8_codes(values * inverse))
    return int(np.count_nonzero(cpu_divide(amax, 448.0) != want_sf))


def test_per_token_cast_scales_are_the_gpus_reciprocal_multiply():
    x = bf16_tensor(1, (64, 512), spread=6)
    codes, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=False)
    assert sf.shape == (64, 4) and sf.dtype == torch.float32
    assert check_deepgemm_cast(x, codes, sf, 1, 128) > 0  # the CPU's division gives other scales here


def test_per_block_and_per_channel_cast_scales_are_the_gpus_reciprocal_multiply():
    x = bf16_tensor(2, (512, 384), spread=3)
    codes, sf = dg.per_block_cast_to_fp8(x, use_ue8m0=False)
    assert sf.shape == (4, 3)
    differ = check_deepgemm_cast(x, codes, sf, 128, 128)
    codes, sf = dg.per_channel_cast_to_fp8(x, use_ue8m0=False)
    assert sf.shape == (4, 384)
    differ += check_deepgemm_cast(x, codes, sf, 128, 1)
    assert differ > 0


def test_casts_of_fp32_inputs_with_padding_and_the_floor_take_the_gpu_formula():
    """fp32 inputs, padded columns, and an all-zero row whose amax is the 1e-4 floor: the same formula."""
    x = torch.from_numpy((np.random.default_rng(3).standard_normal((8, 200)) * 3).astype(F32))
    x[1] = 0.0  # amax below the floor: sf = fp32(1e-4) * fp32(1/448)
    codes, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=False)
    padded = torch.zeros(8, 256)
    padded[:, :200] = x
    amax = strip_amax(padded.numpy(), 1, 128)
    want = gpu_divide(amax, 448.0)
    np.testing.assert_array_equal(sf.numpy(), want)
    assert sf[1, 0].item() == float(F32(1e-4) * (F32(1) / F32(448)))
    assert np.count_nonzero(cpu_divide(amax, 448.0) != want) > 0
    np.testing.assert_array_equal(codes.view(torch.uint8).numpy(),
                                  fp8_codes(x.numpy() * np.repeat(F32(1) / want, 128, axis=1)[:, :200]))


def test_ceil_to_ue8m0_is_the_exact_power_of_two_outside_the_log2_window():
    values = np.array([2.0 ** -10, 1.5 * 2.0 ** -8, 0.75, 3.0, 2.0 ** 100 * 1.25, 0.0, 2.0 ** -140 * 3], F32)
    got = dg.ceil_to_ue8m0(torch.from_numpy(values)).numpy()
    assert got.dtype == F32
    want = [smallest_power_of_two_at_least(v) if v > 0 else 0.0 for v in values]
    assert got.tolist() == want
    # above 2**127 the power of two overflows, as pow(2, 128) does in fp32
    assert dg.ceil_to_ue8m0(torch.tensor([2.0 ** 127 * 1.5])).item() == float("inf")


def test_ceil_to_ue8m0_refuses_a_scale_just_above_a_power_of_two():
    """log2(2**-8 * (1 + 2**-23)) rounds to -8 when correctly rounded (torch's CPU log2 gives the scale 2**-8, below
    the value) and to -8 or above within CUDA's 1-ulp bound: not decided by evidence, so refused."""
    just_above = F32(2.0 ** -8) * (F32(1) + F32(2.0 ** -23))
    assert torch.pow(2.0, torch.ceil(torch.log2(torch.tensor([just_above])))).item() == 2.0 ** -8  # torch on CPU
    with pytest.raises(UnsupportedFeatureError, match="ceil_to_ue8m0.*log2"):
        dg.ceil_to_ue8m0(torch.tensor([1.0, float(just_above)]))
    # an fp32 input whose block scale lands there: amax = 1.75 + 2**-23 (one ulp above 448 * 2**-8)
    x = torch.zeros(128, 128)
    x[0, 0] = float(np.nextafter(F32(1.75), F32(2)))  # amax * fp32(1/448) = 2**-8 * (1 + 2**-23)
    assert float(gpu_divide(x[0, 0].item(), 448.0)) == float(just_above)
    with pytest.raises(UnsupportedFeatureError, match="use_ue8m0=False"):
        dg.per_block_cast_to_fp8(x, use_ue8m0=True)


@pytest.mark.parametrize("values", [every_positive_bf16, every_positive_fp16])
def test_no_bf16_or_fp16_amax_gives_a_ue8m0_scale_in_the_log2_window(values):
    """Every positive bf16 / fp16 amax: its scale (after the floor) is never refused and is the exact power of
    two."""
    amax = np.maximum(values(), F32(1e-4))
    sf = gpu_divide(amax, 448.0)
    got = dg.ceil_to_ue8m0(torch.from_numpy(sf)).numpy()
    distinct = np.unique(sf)
    want = dict(zip(distinct.tolist(), (smallest_power_of_two_at_least(v) for v in distinct)))
    assert got.tolist() == [want[v] for v in sf.tolist()]


# ----------------------------------------------------------------------------------------------------------------
# Item 4: an expert without tokens


@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("n", [128, 300])
def test_per_token_cast_of_zero_rows(n, use_ue8m0):
    codes, sf = dg.per_token_cast_to_fp8(torch.zeros(0, n, dtype=torch.bfloat16), use_ue8m0=use_ue8m0)
    assert codes.shape == (0, n) and codes.dtype == torch.float8_e4m3fn
    assert sf.shape == (0, -(-n // 128)) and sf.dtype == torch.float32
    codes, sf = dg.per_block_cast_to_fp8(torch.zeros(0, n, dtype=torch.bfloat16), use_ue8m0=use_ue8m0)
    assert codes.shape == (0, n) and sf.shape == (0, -(-n // 128))


# ----------------------------------------------------------------------------------------------------------------
# Item 2: NVFP4 (torchao 0.18.0's nvfp4_quantize and per_tensor_amax_to_scale run on the B200)


def fp32_tensors(seed, count=64, shape=(4, 32)):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20))).astype(F32) for _ in range(count)]


def test_nvfp4_global_scale_is_the_gpus_reciprocal_multiply():
    differ = 0
    for x in fp32_tensors(4):
        amax = F32(np.abs(x).max())
        want = gpu_divide(amax, 2688.0)
        assert bq.nvfp4_global_scale(x) == float(want)
        assert bq.quantize_nvfp4(x).global_scale == float(want)
        differ += cpu_divide(amax, 2688.0) != want
    assert differ > 0


def test_nvfp4_block_scale_is_the_gpus_reciprocal_multiply():
    """amax = 1.78124988 (one ulp below 6 * 0.296875): the GPU's fp32(amax * fp32(1/6)) is the e4m3 tie 0.296875,
    which rounds to even (code 0x2A); the CPU's quotient lies just below it (code 0x29)."""
    amax = F32(1.7812498807907104)
    assert gpu_divide(amax, 6.0) == F32(0.296875) and cpu_divide(amax, 6.0) < F32(0.296875)
    x = np.zeros((1, 16), F32)
    x[0, 0] = amax
    assert int(bq.quantize_nvfp4(x, global_scale=None).scales[0, 0]) == 0x2A


def _torchao_nvfp4():
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats import nvfp4_tensor

    return nvfp4_tensor


@pytest.mark.parametrize("two_level", [False, True])
def test_nvfp4_equals_torchao_run_with_the_gpus_division(two_level):
    """torchao 0.18.0's own nvfp4_quantize and per_tensor_amax_to_scale, run with the CUDA kernel's division."""
    nvfp4_tensor = _torchao_nvfp4()
    rows = np.concatenate(fp32_tensors(5, 8) + [np.full((4, 32), 1.7812498807907104, F32)])
    rows[0, 0] = 1e7  # the tensor's amax, whose global scale differs on the CPU
    assert gpu_divide(F32(1e7), 2688.0) != cpu_divide(F32(1e7), 2688.0)
    x = torch.from_numpy(rows)
    with CudaScalarDivision() as mode:
        pts = nvfp4_tensor.per_tensor_amax_to_scale(torch.max(torch.abs(x))) if two_level else None
        scales, data = nvfp4_tensor.nvfp4_quantize(x.clone(), 16, pts)
    assert mode.replaced == (2 if two_level else 1)
    q = bq.quantize_nvfp4(rows, global_scale="dynamic" if two_level else None)
    if two_level:
        assert q.global_scale == float(pts)
    np.testing.assert_array_equal(q.scales, scales.view(torch.uint8).numpy())
    np.testing.assert_array_equal(q.codes, data.view(torch.uint8).numpy())
    if two_level:  # torchao on the CPU (a true division) gives another global scale
        assert float(nvfp4_tensor.per_tensor_amax_to_scale(torch.max(torch.abs(x)))) != q.global_scale
    else:  # and other block scales for these rows
        cpu_scales, _ = nvfp4_tensor.nvfp4_quantize(x.clone(), 16, None)
        assert not np.array_equal(q.scales, cpu_scales.view(torch.uint8).numpy())


@pytest.mark.filterwarnings("ignore::mmaemu.errors.ExperimentalPresetWarning")
def test_nvfp4_layer_keeps_the_gpus_global_scale():
    from mmaemu.nn_recipes import NVFP4Linear

    for seed in range(40):  # the first weight whose CPU-division global scale differs
        weight = fp32_tensors(seed, 1, (4, 64))[0]
        amax = F32(np.abs(weight).max())
        if cpu_divide(amax, 2688.0) != gpu_divide(amax, 2688.0):
            break
    else:
        pytest.fail("no weight found whose global scale differs between the CPU's and the GPU's division")
    linear = torch.nn.Linear(64, 4, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(weight))
    layer = NVFP4Linear.from_linear(linear)
    assert layer.weight_global_scale.item() == float(gpu_divide(amax, 2688.0))


# ----------------------------------------------------------------------------------------------------------------
# Item 3: the row-wise scales (torchao's amax_to_scale: 448 / amax is amax.reciprocal() * 448 in float64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rowwise_power_of_two_scales_are_exact_for_every_bf16_and_fp16_amax(dtype):
    amax = every_positive_bf16() if dtype == torch.bfloat16 else every_positive_fp16()
    rows = torch.from_numpy(amax).to(dtype).reshape(-1, 1)
    got = rowwise_scale(rows).numpy().reshape(-1)
    exact = (448.0 * (1.0 / np.maximum(amax.astype(np.float64), 1e-12))).astype(F32)  # float64, then fp32
    distinct = np.unique(exact)
    want = dict(zip(distinct.tolist(), (largest_power_of_two_at_most(v) for v in distinct)))
    assert got.tolist() == [want[v] for v in exact.tolist()]


def test_rowwise_float64_reciprocal_product_rounds_as_the_quotient():
    """``fp32(fl64(fl64(1 / a) * 448))`` (torchao's ``448 / amax64``) equals ``fp32(448 / a)`` for fp32 amaxes (the
    quotient is never within 2**-49 of an fp32 midpoint, the two float64 roundings move it by at most 2**-52):
    checked on random amaxes over the whole fp32 range, and for ``rowwise_scale`` itself on some."""
    rng = np.random.default_rng(7)
    amax = rng.integers(0x00800000, 0x7F000000, 200_000, dtype=np.uint32).view(F32).astype(np.float64)
    with np.errstate(over="ignore"):  # 448 / a beyond the fp32 range is +Inf either way
        product = (448.0 * (1.0 / amax)).astype(F32)
        np.testing.assert_array_equal(product, (448.0 / amax).astype(F32))
    above_eps = amax >= 1e-12  # torchao clamps smaller amaxes to 1e-12
    rows = torch.from_numpy(amax[above_eps][:512].astype(F32).reshape(-1, 1))
    got = rowwise_scale(rows, round_scales_to_power_of_2=False).numpy().reshape(-1)
    np.testing.assert_array_equal(got, product[above_eps][:512])


def test_rowwise_scale_just_below_a_power_of_two_is_refused():
    """amax = 1.75 + 2**-23: s = fp32(448 / amax) = 2**8 * (1 - 2**-24), one ulp below 256; log2 s = 8 - 8.6e-8
    rounds to 8 when correctly rounded (torch's CPU gives the scale 256, above s) and to 8 or below within CUDA's
    1-ulp bound: not decided by evidence, so refused."""
    amax = np.nextafter(F32(1.75), F32(2))
    x = torch.tensor([[float(amax), 1.0]])
    s = rowwise_scale(x, round_scales_to_power_of_2=False).item()
    assert s == 2.0 ** 8 * (1 - 2.0 ** -24)
    assert torch.exp2(torch.floor(torch.log2(torch.tensor(s)))).item() == 256.0  # torch on the CPU
    with pytest.raises(UnsupportedFeatureError, match="round_scales_to_power_of_2=False"):
        rowwise_scale(x)
    with pytest.raises(UnsupportedFeatureError):
        quantize_rowwise(x)


def test_gpu_divide_differs_from_the_cpu_division_for_the_casts_divisors():
    """The premise of the tests above, on every positive bf16 value: each divisor's two results differ often."""
    values = every_positive_bf16()
    for number in (448.0, 6.0, 2688.0):
        assert np.count_nonzero(gpu_divide(values, number) != cpu_divide(values, number)) > values.size // 10
    with CudaScalarDivision():
        got = torch.from_numpy(values) / 448.0
    np.testing.assert_array_equal(got.numpy(), values * F32(cuda_inverse(448.0)))


# ----------------------------------------------------------------------------------------------------------------
# Item 3: the layers' scale updates


def test_te_layer_current_scaling_is_te_kernels_fp32_division():
    """EmulatedFP8Linear's per-call scale is TE's ``compute_scale_from_amax``: ``448 / amax`` divided in device code
    (correctly rounded), its inverse ``1 / s`` likewise; a torch port's ``448.0 / amax`` (``amax.reciprocal() *
    448``, on every device) would give other scales for some of these inputs."""
    from mmaemu.nn import EmulatedFP8Linear

    layer = EmulatedFP8Linear.from_linear(torch.nn.Linear(32, 8, bias=False), profile="hopper")
    differ = 0
    for seed in range(32):
        x = torch.from_numpy(fp32_tensors(100 + seed, 1, (3, 32))[0])
        amax = F32(np.abs(x.numpy()).max())
        want_scale = F32(448.0) / amax
        x_fp8, _, _, scale_inv = layer._gemm_arguments(x)
        assert scale_inv.item() == float(F32(1.0) / want_scale)
        assert torch.equal(x_fp8.view(torch.uint8), quantize(x, float(want_scale)).view(torch.uint8))
        torch_port = (torch.tensor(amax).reciprocal() * 448.0).item()
        differ += torch_port != float(want_scale)
    assert differ > 0


def test_torchao_to_mx_and_rowwise_scales_divide_by_no_python_number():
    """torchao 0.18.0's to_mx and tensor_to_scale (row-wise) run under CudaScalarDivision replace no division:
    their operations are the same on CPU and CUDA (docs/semantics.md section 13), and mmaemu equals them."""
    pytest.importorskip("torchao")
    from torchao.float8 import float8_utils
    from torchao.float8.config import ScalingGranularity
    from torchao.prototype.mx_formats import mx_tensor

    x = torch.from_numpy(np.concatenate(fp32_tensors(8, 4, (8, 64))))
    with CudaScalarDivision() as mode:
        mx_scales, mx_data = mx_tensor.to_mx(x.clone(), torch.float8_e4m3fn, 32)
        row_scales = [float8_utils.tensor_to_scale(x.bfloat16(), torch.float8_e4m3fn,
                                                   scaling_granularity=ScalingGranularity.AXISWISE,
                                                   axiswise_dim=-1, round_scales_to_power_of_2=power_2)
                      for power_2 in (False, True)]
    assert mode.replaced == 0
    for power_2, want in zip((False, True), row_scales):
        assert torch.equal(rowwise_scale(x.bfloat16(), round_scales_to_power_of_2=power_2), want)
    q = bq.quantize_mx(x, "e4m3")
    assert torch.equal(q.scales.view(torch.uint8), mx_scales.view(torch.uint8))
    assert torch.equal(q.codes.view(torch.uint8), mx_data.view(torch.uint8))

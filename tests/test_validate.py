"""Validation of scaled_mm / accumulate calls (semantics.md f.1-f.6, f.8; platform.md sections 1, 2, 9) and the
CPU flush-to-zero refusal (semantics.md (e)). torch._scaled_mm is never called: torch 2.7.1's CUDA behaviour is
reproduced from the spec."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy
import pytest
import torch

from mmaemu.errors import MmaemuError, ReferenceRejectsError, UnsupportedFeatureError
from mmaemu.plan.flush import check_no_flush_to_zero, fp32_subnormals_flushed
from mmaemu.platform import get_profile
from mmaemu.plan.layout import (
    byte_misalignment,
    is_column_major,
    is_layout_std,
    is_row_major,
    leading_dimensions,
    mat2_is_column_major,
)
from mmaemu.plan.validate import (
    AccumulateCall,
    ScaledMMCall,
    split_key,
    validate_accumulate,
    validate_scaled_mm,
)

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
E4M3FNUZ = torch.float8_e4m3fnuz
E5M2FNUZ = torch.float8_e5m2fnuz
E8M0 = torch.float8_e8m0fnu


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------


class StandInProfile:
    """Duck type of platform.profiles.Profile: .name and .rejection(fmt_a, fmt_b, out_dtype)."""

    def __init__(self, name="hopper", rules=(("e4m3", "e4m3", "float8_e5m2"),)):
        self.name = name
        self.rules = rules
        self.calls = []

    def rejection(self, fmt_a, fmt_b, out_dtype):
        self.calls.append((fmt_a, fmt_b, out_dtype))
        out_name = str(out_dtype).rpartition(".")[2]
        for rule_a, rule_b, rule_out in self.rules:
            if (rule_a, rule_b, rule_out) == (fmt_a, fmt_b, out_name):
                return SimpleNamespace(
                    fmt_a=rule_a, fmt_b=rule_b, out_dtype=rule_out,
                    message="E4M3 x E4M3 -> float8_e5m2 is refused by cuBLASLt 12.8.3 on the H100 (sm_90): "
                            "CUBLAS_STATUS_NOT_SUPPORTED",
                )
        return None


def fp8(rows, cols, dtype=E4M3):
    """A row-major [rows, cols] FP8 tensor of zeros."""
    return torch.zeros(rows, cols, dtype=dtype)


def weight(K, N, dtype=E4M3):
    """A column-major [K, N] mat2: the transpose of a row-major [N, K] weight."""
    return fp8(N, K, dtype).t()


def one(shape=()):
    return torch.ones(shape, dtype=torch.float32)


def args(M=32, K=32, N=48, a=E4M3, b=E4M3, **overrides):
    """Keyword arguments of a valid tensor-wise call, with overrides."""
    kwargs = dict(input=fp8(M, K, a), mat2=weight(K, N, b), scale_a=one(), scale_b=one(), profile=StandInProfile())
    kwargs.update(overrides)
    return kwargs


def validate(**overrides):
    return validate_scaled_mm(**args(**overrides))


def rejects(exc_class, pattern, **overrides):
    """Assert the call raises exactly exc_class with a message matching pattern; return the message."""
    with pytest.raises(exc_class, match=pattern) as info:
        validate(**overrides)
    assert type(info.value) is exc_class
    return str(info.value)


def strided(rows, cols, strides, dtype=E4M3, offset=0):
    """A [rows, cols] view with the given strides (and storage offset) into a large enough zero buffer."""
    size = offset + sum((n - 1) * s for n, s in zip((rows, cols), strides)) + 1
    return torch.zeros(size, dtype=dtype).as_strided((rows, cols), strides, offset)


# ---------------------------------------------------------------------------------------------------------------
# A valid call
# ---------------------------------------------------------------------------------------------------------------


def test_valid_call_fields():
    kwargs = args(M=8, K=64, N=32, b=E5M2, out_dtype=torch.bfloat16, use_fast_accum=True)
    call = validate_scaled_mm(**kwargs)
    assert isinstance(call, ScaledMMCall)
    assert (call.M, call.N, call.K) == (8, 32, 64)
    assert (call.fmt_a, call.fmt_b) == ("e4m3", "e5m2")
    assert call.out_dtype == torch.bfloat16
    assert call.use_fast_accum is True
    assert call.input is kwargs["input"] and call.mat2 is kwargs["mat2"]
    assert call.scale_a is kwargs["scale_a"] and call.scale_b is kwargs["scale_b"]
    assert call.scale_result is None and call.out is None
    assert not call.zero_size and call.layout_std and not call.input_copied
    assert not (call.out_column_major or call.out_unusable or call.out_resize or call.out_resize_warns)
    assert call.device == torch.device("cpu")
    assert split_key(call) == (8, 32, 64, "e4m3", "e5m2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.M = 3
    assert "M=8" in repr(call)


@pytest.mark.parametrize("od,expected", [(None, E4M3), (torch.float32, torch.float32), (torch.float16, torch.float16),
                                         (E4M3, E4M3)])
def test_effective_out_dtype_default_is_input_dtype(od, expected):
    assert validate(out_dtype=od).out_dtype == expected


def test_effective_out_dtype_from_out():
    assert validate(out=torch.empty(32, 48, dtype=torch.bfloat16)).out_dtype == torch.bfloat16


@pytest.mark.parametrize("shape", [(), (1,), (1, 1), (1, 1, 1)])
def test_tensorwise_scales_any_one_element_shape(shape):
    assert not validate(scale_a=one(shape), scale_b=one(shape)).zero_size


def test_m_has_no_divisibility_rule():
    call = validate(M=3)
    assert call.M == 3


def test_scale_result_accepted():
    call = validate(scale_result=one([1]), out_dtype=E4M3)
    assert call.scale_result is not None


# ---------------------------------------------------------------------------------------------------------------
# f.1 Python types -> TypeError
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["input", "mat2", "scale_a", "scale_b"])
def test_f1_1_tensors_required(name):
    with pytest.raises(TypeError, match=f"{name} must be a torch.Tensor"):
        validate(**{name: [[1.0]]})


@pytest.mark.parametrize("name", ["bias", "scale_result", "out"])
def test_f1_2_optional_tensors(name):
    with pytest.raises(TypeError, match=f"{name} must be None or a torch.Tensor"):
        validate(**{name: 1.0})


@pytest.mark.parametrize("value", ["bfloat16", numpy.float32, 5])
def test_f1_3_out_dtype_must_be_torch_dtype(value):
    with pytest.raises(TypeError, match="out_dtype must be None or a torch.dtype"):
        validate(out_dtype=value)


@pytest.mark.parametrize("value", [numpy.bool_(True), numpy.bool_(False), 1, 0, None, "True"])
def test_f1_4_use_fast_accum_exact_bool(value):
    with pytest.raises(TypeError, match=r"use_fast_accum must be a Python bool.*bool\(use_fast_accum\)"):
        validate(use_fast_accum=value)


def test_f1_types_before_f2_rules():
    # a 3-D input (f.2.1) with a numpy.bool_ use_fast_accum (f.1.4): the type error wins
    with pytest.raises(TypeError):
        validate(input=torch.zeros(2, 32, 32, dtype=E4M3), use_fast_accum=numpy.bool_(True))


# ---------------------------------------------------------------------------------------------------------------
# f.2 torch _scaled_mm checks -> ReferenceRejectsError, each rule
# ---------------------------------------------------------------------------------------------------------------

def test_f2_1_mat1_must_be_a_matrix():
    msg = rejects(ReferenceRejectsError, "mat1 must be a matrix", input=torch.zeros(2, 32, 32, dtype=E4M3))
    assert msg.endswith("[torch 2.7.1 _scaled_mm]")
    rejects(ReferenceRejectsError, "mat1 must be a matrix", input=torch.zeros(32, dtype=E4M3))


def test_f2_2_mat2_must_be_a_matrix():
    rejects(ReferenceRejectsError, "mat2 must be a matrix", mat2=torch.zeros(32, dtype=E4M3))


def test_f2_3_shapes_cannot_be_multiplied():
    rejects(ReferenceRejectsError, r"mat1 and mat2 shapes cannot be multiplied \(32x32 and 48x32\)",
            mat2=fp8(48, 32))


@pytest.mark.parametrize("which", ["scale_a", "scale_b"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_f2_4_scales_must_be_fp32(which, dtype):
    rejects(ReferenceRejectsError, r"Both scale_a and scale_b must be float \(fp32\) tensors",
            **{which: torch.ones((), dtype=dtype)})


def test_f2_5_non_tensorwise_scales_must_be_2d():
    rejects(ReferenceRejectsError, "scale tensors must be 2-dimensional", scale_a=one([32]))
    rejects(ReferenceRejectsError, "scale tensors must be 2-dimensional", scale_a=one([32, 1]), scale_b=one([48]))


def test_f2_5_invalid_scaling_configuration():
    rejects(ReferenceRejectsError, r"Invalid scaling configuration.*scale_a should be \(32, 1\)", scale_a=one([1, 32]),
            scale_b=one([1, 48]))
    rejects(ReferenceRejectsError, "Invalid scaling configuration", scale_a=one([32, 1]), scale_b=one([48, 1]))
    rejects(ReferenceRejectsError, "Invalid scaling configuration", scale_a=one([2, 1]), scale_b=one([1, 1]))


def test_f2_5_rowwise_scales_must_be_contiguous():
    scale_a = torch.ones(32, 2)[:, :1]
    assert not scale_a.is_contiguous()
    rejects(ReferenceRejectsError, "must be contiguous for RowWise scaling", scale_a=scale_a, scale_b=one([1, 48]),
            out_dtype=torch.bfloat16)


@pytest.mark.parametrize("scale_result", [one([2]), torch.ones((), dtype=torch.float64)])
def test_f2_6_scale_result_float_scalar(scale_result):
    rejects(ReferenceRejectsError, "scale_result must be a float scalar", scale_result=scale_result)


def test_f2_7_bias_size():
    rejects(ReferenceRejectsError, "Bias must be size 48 but got 32",
            bias=torch.zeros(32, dtype=torch.bfloat16), out_dtype=torch.bfloat16)


@pytest.mark.parametrize("K", [8, 24, 40])
def test_f2_8_k_divisible_by_16(K):
    rejects(ReferenceRejectsError, r"Expected trailing dimension of mat1 to be divisible by 16", K=K)


@pytest.mark.parametrize("N", [8, 40])
def test_f2_9_n_divisible_by_16(N):
    rejects(ReferenceRejectsError, r"mat2 shape \(32x\d+\) must be divisible by 16", N=N)


def test_f2_10_out_dtype_must_match_out():
    rejects(ReferenceRejectsError, "out_dtype must match output matrix type",
            out=torch.empty(32, 48, dtype=torch.float32), out_dtype=torch.bfloat16)


@pytest.mark.parametrize("which,label", [("input", "mat1"), ("mat2", "mat2")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8, torch.int8])
def test_f2_11_operands_must_be_float8(which, label, dtype):
    tensor = fp8(32, 32, dtype) if which == "input" else weight(32, 48, dtype)
    rejects(ReferenceRejectsError, f"Expected {label} to be Float8 matrix", **{which: tensor})


def test_f2_12_e5m2_times_e5m2():
    rejects(ReferenceRejectsError, "Multiplication of two Float8_e5m2 matrices is not supported", a=E5M2, b=E5M2)


@pytest.mark.parametrize(
    "bias_dtype,od,pattern",
    [
        (torch.bfloat16, torch.float32, "Bias is not supported when out_dtype is set to Float32"),
        (torch.float32, torch.bfloat16, "Bias must be either Half or BFloat16"),
        (torch.float16, torch.bfloat16, "Bias must be BFloat16 to compute"),
        (torch.bfloat16, torch.float16, "Bias must be Float16 to compute"),
        (torch.float32, E4M3, "Bias must be either Half or BFloat16"),
    ],
)
def test_f2_13_bias_dtype_rules(bias_dtype, od, pattern):
    rejects(ReferenceRejectsError, pattern, bias=torch.zeros(48, dtype=bias_dtype), out_dtype=od)


@pytest.mark.parametrize("which", ["out", "mat2", "bias", "scale_a", "scale_b", "scale_result"])
def test_f2_14_same_device(which):
    overrides = {"out_dtype": torch.bfloat16, "bias": torch.zeros(48, dtype=torch.bfloat16), "scale_result": one()}
    value = {
        "out": torch.empty(32, 48, dtype=torch.bfloat16, device="meta"),
        "mat2": weight(32, 48).to("meta"),
        "bias": torch.zeros(48, dtype=torch.bfloat16, device="meta"),
        "scale_a": one().to("meta"),
        "scale_b": one().to("meta"),
        "scale_result": one().to("meta"),
    }[which]
    overrides[which] = value
    rejects(ReferenceRejectsError, f"same device: {which} is on meta", **overrides)


# ---------------------------------------------------------------------------------------------------------------
# f.2 order: a call breaking two rules raises the earlier one
# ---------------------------------------------------------------------------------------------------------------

ORDER_CASES = [
    # (earlier rule pattern, overrides breaking the earlier and a later rule)
    ("mat1 must be a matrix", dict(input=torch.zeros(32, dtype=E4M3), mat2=torch.zeros(32, dtype=E4M3))),
    ("mat2 must be a matrix", dict(mat2=torch.zeros(32, dtype=E4M3), scale_a=torch.ones((), dtype=torch.half))),
    ("shapes cannot be multiplied", dict(mat2=fp8(48, 32), scale_a=torch.ones((), dtype=torch.half))),
    ("must be float \\(fp32\\)", dict(scale_a=torch.ones(5, dtype=torch.half), K=24)),
    ("Invalid scaling configuration", dict(scale_a=one([3, 1]), scale_b=one([1, 1]), scale_result=one([2]))),
    ("scale_result must be a float scalar", dict(scale_result=one([2]), bias=torch.zeros(5, dtype=torch.half))),
    ("Bias must be size", dict(bias=torch.zeros(5, dtype=torch.half), K=24)),
    ("trailing dimension of mat1", dict(K=24, N=40)),
    ("mat2 shape", dict(N=40, out=torch.empty(32, 40), out_dtype=torch.bfloat16)),
    ("out_dtype must match", dict(out=torch.empty(32, 48), out_dtype=torch.bfloat16, a=torch.float32)),
    ("Expected mat1 to be Float8", dict(a=torch.float32, b=torch.float32)),
    ("Expected mat2 to be Float8", dict(b=torch.float32, bias=torch.zeros(48, dtype=torch.float32),
                                        out_dtype=torch.bfloat16)),
    ("two Float8_e5m2", dict(a=E5M2, b=E5M2, bias=torch.zeros(48, dtype=torch.bfloat16), out_dtype=torch.float32)),
    ("Bias is not supported", dict(bias=torch.zeros(48, dtype=torch.bfloat16), out_dtype=torch.float32,
                                   scale_b=one().to("meta"))),
    # f.2 before f.3: a zero-size call still gets torch's checks
    ("must be float \\(fp32\\)", dict(M=0, scale_a=torch.ones((), dtype=torch.half))),
    ("Expected mat1 to be Float8", dict(K=0, a=torch.float32)),
    ("mat2 shape", dict(M=0, N=8)),
    # f.2 before f.4
    ("same device", dict(scale_b=one().to("meta"), input=fp8(32, 32).t())),
    ("Bias is not supported", dict(bias=torch.zeros(48, dtype=torch.bfloat16), out_dtype=torch.float32,
                                   input=fp8(32, 32).t())),
]


@pytest.mark.parametrize("pattern,overrides", ORDER_CASES, ids=[c[0] for c in ORDER_CASES])
def test_order_earlier_rule_wins(pattern, overrides):
    rejects(ReferenceRejectsError, pattern, **overrides)


# ---------------------------------------------------------------------------------------------------------------
# f.3 zero-size early return
# ---------------------------------------------------------------------------------------------------------------

NAN = torch.tensor(math.nan)


@pytest.mark.parametrize("M,K,N", [(0, 32, 48), (32, 0, 48), (32, 32, 0), (0, 0, 0)])
@pytest.mark.parametrize(
    "extra",
    [
        dict(),
        dict(scale_a=NAN.clone(), scale_b=NAN.clone(), scale_result=NAN.clone()),
        dict(a=E4M3FNUZ, b=E5M2FNUZ),
        dict(a=E8M0, b=E8M0),
        dict(out_dtype=torch.float64),
        dict(out_dtype=torch.int32),
        dict(out_dtype=torch.float8_e5m2),  # E4M3 x E4M3 -> E5M2: the profile rule does not apply
        dict(input_layout="column-major"),
        dict(bias=True, out_dtype=torch.bfloat16),
        dict(rowwise=True, out_dtype=torch.float32),
        dict(requires_grad=True),
        dict(use_fast_accum=True),
    ],
)
def test_f3_zero_size_early_return(M, K, N, extra):
    extra = dict(extra)
    overrides = dict(M=M, K=K, N=N)
    if extra.pop("input_layout", None):
        overrides["input"] = fp8(K, M).t()
    if extra.pop("bias", None):
        overrides["bias"] = torch.zeros(N, dtype=torch.bfloat16)
    if extra.pop("rowwise", None):
        overrides["scale_a"], overrides["scale_b"] = one([M, 1]), one([1, N])
    if extra.pop("requires_grad", None):
        overrides["scale_a"] = one().requires_grad_(True)
    overrides.update(extra)
    profile = StandInProfile()
    call = validate(profile=profile, **overrides)
    assert call.zero_size
    assert (call.M, call.N, call.K) == (M, N, K)
    assert profile.calls == []  # f.5 never consulted
    assert not call.out_unusable and not call.out_column_major


def test_f3_zero_size_fields():
    call = validate(M=0, a=E4M3FNUZ, out_dtype=torch.float64)
    assert call.out_dtype == torch.float64
    assert call.fmt_a is None and call.fmt_b == "e4m3"
    call = validate(K=0, b=E5M2)
    assert (call.fmt_a, call.fmt_b) == ("e4m3", "e5m2")
    assert call.out_dtype == E4M3


def test_f3_zero_size_out_resize_flags():
    call = validate(K=0, out=torch.empty(3, 3))
    assert call.out_resize and call.out_resize_warns
    call = validate(M=0, out=torch.empty(0))
    assert call.out_resize and not call.out_resize_warns
    # a neither-major out of the right shape is zero-filled in place by torch: not unusable
    out = torch.empty(32, 96)[:, ::2]
    call = validate(K=0, out=out)
    assert not call.out_unusable and not call.out_resize


# ---------------------------------------------------------------------------------------------------------------
# f.4 cuBLAS / cuBLASLt-level checks
# ---------------------------------------------------------------------------------------------------------------

CUBLASLT_TAG = "[cuBLASLt 12.8.3.14]"


def test_f4_1_rowwise_needs_bf16_output():
    msg = rejects(ReferenceRejectsError, "Only bf16 high precision output types are supported for row-wise scaling",
                  scale_a=one([32, 1]), scale_b=one([1, 48]), out_dtype=torch.float16)
    assert msg.endswith("[torch 2.7.1 _scaled_mm]")  # Blas.cpp's check before the row-wise kernel
    rejects(ReferenceRejectsError, "Only bf16 high precision output types", scale_a=one([32, 1]),
            scale_b=one([1, 48]))  # default od = input dtype


def test_f4_2_column_major_input_rejected():
    rejects(ReferenceRejectsError, r"row-major and column-major.*input \(mat1\) must be row-major.*contiguous\(\)",
            input=fp8(32, 32).t())


def test_f4_2_row_major_mat2_rejected():
    rejects(ReferenceRejectsError, r"row-major and column-major.*mat2 must be column-major.*w\.t\(\)",
            mat2=fp8(32, 48))


def test_f4_2_neither_major_mat2_rejected():
    mat2 = fp8(48, 64).t()[:, ::1][::2, :]  # [32, 48] with strides (2, 64)
    assert not is_row_major(mat2) and not is_column_major(mat2)
    rejects(ReferenceRejectsError, "mat2 must be column-major", mat2=mat2)


def test_f4_2_row_major_with_padded_ld_accepted():
    input = fp8(32, 48)[:, :32]  # strides (48, 1): row-major, not contiguous
    mat2 = fp8(48, 64)[:, :32].t()  # [32, 48], strides (1, 64): column-major with ldb = 64
    assert not input.is_contiguous() and is_row_major(input)
    assert mat2_is_column_major(mat2) and not mat2.t().is_contiguous()
    call = validate(input=input, mat2=mat2)
    assert call.input is input and call.mat2 is mat2 and not call.input_copied
    assert not call.layout_std


def test_f4_2_strided_slice_input_silently_copied():
    base = torch.arange(32 * 64, dtype=torch.float32).remainder(7).reshape(32, 64).to(E4M3)
    input = base[:, ::2]  # [32, 32], strides (64, 2): neither
    call = validate(input=input)
    assert call.input_copied and call.input is not input
    assert call.input.is_contiguous()
    assert torch.equal(call.input.view(torch.uint8), input.contiguous().view(torch.uint8))
    assert call.layout_std


def test_f4_2_copy_precedes_later_checks():
    # the slice starts 8 bytes into its storage and has lda 64: its contiguous copy passes f.4.5 and f.4.6
    input = strided(32, 32, (64, 2), offset=8)
    assert byte_misalignment(input) == 8
    call = validate(input=input)
    assert call.input_copied and call.input.storage_offset() == 0


def test_f4_3_fnuz_and_e8m0_rejected():
    for a, b in [(E4M3FNUZ, E4M3), (E4M3, E5M2FNUZ), (E8M0, E4M3), (E4M3FNUZ, E5M2FNUZ)]:
        msg = rejects(ReferenceRejectsError, r"not supported by the FP8 GEMM.*fnuz and e8m0", a=a, b=b)
        assert "float8_e4m3fn or torch.float8_e5m2" in msg


@pytest.mark.parametrize("od", [torch.float64, torch.int32, torch.uint8, E4M3FNUZ, torch.complex64])
def test_f4_4_out_dtype_not_supported_by_cublas(od):
    rejects(ReferenceRejectsError, "CUBLAS_STATUS_NOT_SUPPORTED", out_dtype=od)


@pytest.mark.parametrize("od", [torch.float32, torch.bfloat16, torch.float16, E4M3])
def test_f4_4_supported_out_dtypes(od):
    assert validate(out_dtype=od).out_dtype == od


def test_f4_5_alignment_via_storage_offset():
    assert not validate(input=strided(32, 32, (32, 1), offset=16)).zero_size
    rejects(ReferenceRejectsError, r"16-byte aligned: input's data starts 8 byte", input=strided(32, 32, (32, 1),
                                                                                               offset=8))
    rejects(ReferenceRejectsError, r"16-byte aligned: mat2's data starts 4 byte", mat2=strided(32, 48, (1, 32),
                                                                                              offset=4))


def test_f4_5_alignment_counts_bytes_not_elements():
    t = strided(4, 16, (16, 1), dtype=torch.float32, offset=4)
    assert byte_misalignment(t) == 0
    t = strided(4, 16, (16, 1), dtype=torch.float32, offset=2)
    assert byte_misalignment(t) == 8


def test_f4_6_lda_multiple_of_16():
    input = strided(2, 32, (40, 1))  # row-major, lda 40
    assert is_row_major(input)
    rejects(ReferenceRejectsError, r"leading dimensions must be multiples of 16: lda=40", input=input, M=2)


def test_f4_6_lda_ignored_when_m_is_1():
    input = strided(1, 32, (40, 1))  # lda would be 40, but M == 1 -> lda = K
    call = validate(input=input, M=1)
    assert call.M == 1 and leading_dimensions(input, call.mat2) == (32, 32)


def test_f4_6_ldb_multiple_of_16():
    mat2 = strided(32, 48, (1, 40))  # column-major, ldb 40
    assert mat2_is_column_major(mat2)
    rejects(ReferenceRejectsError, r"ldb=40", mat2=mat2)


def test_f4_6_ldb_is_k_when_n_is_1():
    # N == 1 never reaches f.4.6 (N % 16), so the definition is checked directly
    input, mat2 = fp8(4, 32), strided(32, 1, (1, 40))
    assert leading_dimensions(input, mat2) == (32, 32)
    assert leading_dimensions(input, strided(32, 2, (1, 40))) == (32, 40)


F4_ORDER_CASES = [
    ("Only bf16 high precision", dict(scale_a=one([32, 1]), scale_b=one([1, 48]), input=fp8(32, 32).t())),
    ("input \\(mat1\\) must be row-major", dict(input=fp8(32, 32).t(), a=E4M3FNUZ)),
    ("mat2 must be column-major", dict(mat2=fp8(32, 48, E5M2FNUZ))),
    ("not supported by the FP8 GEMM", dict(a=E4M3FNUZ, out_dtype=torch.float64)),
    ("CUBLAS_STATUS_NOT_SUPPORTED", dict(out_dtype=torch.float64, input=strided(32, 32, (32, 1), offset=8))),
    ("16-byte aligned", dict(input=strided(32, 32, (40, 1), offset=8))),
]


@pytest.mark.parametrize("pattern,overrides", F4_ORDER_CASES, ids=[c[0] for c in F4_ORDER_CASES])
def test_f4_order_earlier_rule_wins(pattern, overrides):
    rejects(ReferenceRejectsError, pattern, **overrides)


# ---------------------------------------------------------------------------------------------------------------
# f.5 profile rejections
# ---------------------------------------------------------------------------------------------------------------


def test_f5_e4m3_e4m3_to_e5m2_rejected_naming_the_profile():
    profile = StandInProfile("hopper")
    msg = rejects(ReferenceRejectsError, "CUBLAS_STATUS_NOT_SUPPORTED", out_dtype=E5M2, profile=profile)
    assert msg.endswith("[profile hopper]")
    assert profile.calls == [("e4m3", "e4m3", "float8_e5m2")]
    msg = rejects(ReferenceRejectsError, "E4M3 x E4M3", out=torch.empty(32, 48, dtype=E5M2),
                  profile=StandInProfile("ada-te"))
    assert msg.endswith("[profile ada-te]")


@pytest.mark.parametrize("a,b", [(E4M3, E5M2), (E5M2, E4M3)])
def test_f5_mixed_formats_may_produce_e5m2(a, b):
    assert validate(a=a, b=b, out_dtype=E5M2).out_dtype == E5M2


def test_f5_profile_without_rules_computes_e4m3_e4m3_to_e5m2():
    profile = StandInProfile("hopper-experimental", rules=())
    assert validate(out_dtype=E5M2, profile=profile).out_dtype == E5M2


def test_f5_after_f4():
    rejects(ReferenceRejectsError, "ldb=40", mat2=strided(32, 48, (1, 40)), out_dtype=E5M2)


# ---------------------------------------------------------------------------------------------------------------
# f.6 scope -> UnsupportedFeatureError
# ---------------------------------------------------------------------------------------------------------------

SCOPE_TAG = "[mmaemu scope]"


@pytest.mark.parametrize("od,bias_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                           (E4M3, torch.float16), (E4M3, torch.bfloat16)])
def test_f6_bias_unsupported(od, bias_dtype):
    msg = rejects(UnsupportedFeatureError, "bias is valid on the reference platform but not modelled",
                  bias=torch.zeros(48, dtype=bias_dtype), out_dtype=od)
    assert msg.endswith(SCOPE_TAG)


def test_f6_rowwise_needs_a_modelled_platform():
    """Row-wise calls are modelled on the H100 torch profiles only (tests/test_rowwise.py has the rest)."""
    rejects(UnsupportedFeatureError, "row-wise scaling.*modelled only", scale_a=one([32, 1]), scale_b=one([1, 48]),
            out_dtype=torch.bfloat16)
    call = validate(scale_a=one([32, 1]), scale_b=one([1, 48]), out_dtype=torch.bfloat16, profile=get_profile("hopper"))
    assert call.recipe.name == "rowwise" and call.bias is None


@pytest.mark.parametrize("name", ["input", "mat2", "scale_a", "scale_b", "scale_result"])
def test_f6_requires_grad_rejected_under_grad_mode(name):
    kwargs = args(scale_result=one())
    if name == "mat2":
        kwargs["mat2"] = fp8(48, 32).requires_grad_(True).t()
    else:
        kwargs[name] = kwargs[name].detach().clone().requires_grad_(True)
    with torch.enable_grad():
        with pytest.raises(UnsupportedFeatureError, match=f"{name} require.*torch.no_grad") as info:
            validate_scaled_mm(**kwargs)
        assert type(info.value) is UnsupportedFeatureError
    with torch.no_grad():
        assert not validate_scaled_mm(**kwargs).zero_size
    with torch.inference_mode():
        assert not validate_scaled_mm(**kwargs).zero_size


def test_f6_order_bias_then_rowwise_then_grad():
    grad_scale = one([32, 1]).requires_grad_(True)
    with torch.enable_grad():
        rejects(UnsupportedFeatureError, "bias", bias=torch.zeros(48, dtype=torch.bfloat16), out_dtype=torch.bfloat16,
                scale_a=one().requires_grad_(True))
        rejects(UnsupportedFeatureError, "row-wise", out_dtype=torch.bfloat16, scale_a=grad_scale,
                scale_b=one([1, 48]))


def test_f5_before_f6():
    rejects(ReferenceRejectsError, r"\[profile hopper\]$", out_dtype=E5M2, bias=torch.zeros(48, dtype=torch.half))


def test_f4_before_f6():
    with torch.enable_grad():
        rejects(ReferenceRejectsError, "must be row-major", input=fp8(32, 32).t().requires_grad_(True))


# ---------------------------------------------------------------------------------------------------------------
# out= flags and the split-K key swap (f.7.2, platform.md section 2)
# ---------------------------------------------------------------------------------------------------------------


def test_out_row_major_plain():
    call = validate(out=torch.empty(32, 48, dtype=E4M3))
    assert not (call.out_column_major or call.out_unusable or call.out_resize)
    padded = validate(out=torch.empty(32, 64, dtype=E4M3)[:, :48])
    assert not (padded.out_column_major or padded.out_unusable or padded.out_resize)


def test_out_column_major_swaps_the_key():
    out = torch.empty(48, 32, dtype=torch.bfloat16).t()
    call = validate(a=E4M3, b=E5M2, out=out, M=32, K=64, N=48)
    assert call.out_column_major and not call.out_unusable and not call.out_resize
    assert split_key(call) == (48, 32, 64, "e5m2", "e4m3")
    assert call.out is out


def test_out_neither_major_is_unusable():
    out = torch.empty(32, 96, dtype=torch.bfloat16)[:, ::2]
    call = validate(out=out)
    assert call.out_unusable and not call.out_column_major and not call.out_resize
    assert split_key(call) == (32, 48, 32, "e4m3", "e4m3")


def test_out_other_shape_is_resized():
    call = validate(out=torch.empty(48, 32, dtype=torch.bfloat16))
    assert call.out_resize and call.out_resize_warns and not call.out_column_major and not call.out_unusable
    call = validate(out=torch.empty(0, dtype=torch.bfloat16))
    assert call.out_resize and not call.out_resize_warns
    call = validate(out=torch.empty(32 * 48, dtype=torch.bfloat16))
    assert call.out_resize and call.out_resize_warns


# ---------------------------------------------------------------------------------------------------------------
# Layout definitions
# ---------------------------------------------------------------------------------------------------------------


def test_layout_definitions():
    t = fp8(4, 8)
    assert is_row_major(t) and not is_column_major(t)
    assert is_column_major(t.t()) and not is_row_major(t.t())
    assert is_row_major(fp8(4, 16)[:, :8]) and not is_column_major(fp8(4, 16)[:, :8])
    assert is_column_major(fp8(16, 4)[:8].t())
    s = fp8(4, 16)[:, ::2]
    assert not is_row_major(s) and not is_column_major(s)
    # stride below the row length is neither
    assert not is_row_major(strided(4, 8, (4, 1))) and not is_column_major(strided(4, 8, (4, 1)))
    # a single row with any row stride is contiguous
    assert is_row_major(strided(1, 8, (3, 1)))


def test_layout_std():
    assert is_layout_std(fp8(4, 32), weight(32, 16))
    assert not is_layout_std(fp8(4, 48)[:, :32], weight(32, 16))
    assert not is_layout_std(fp8(4, 32), fp8(16, 48)[:, :32].t())


# ---------------------------------------------------------------------------------------------------------------
# f.8 accumulate
# ---------------------------------------------------------------------------------------------------------------


def test_f8_valid_any_k_layout_alignment_and_e5m2_pair():
    a = strided(3, 7, (1, 5), dtype=E5M2, offset=3)  # column-major, misaligned, K = 7
    b = fp8(20, 7, E5M2)[::2]  # [10, 7] row stride 14
    call = validate_accumulate(a, b, use_fast_accum=numpy.bool_(True))
    assert isinstance(call, AccumulateCall)
    assert (call.M, call.N, call.K, call.fmt_a, call.fmt_b) == (3, 10, 7, "e5m2", "e5m2")
    assert call.use_fast_accum is True and not call.zero_size and call.a is a and call.b is b
    assert call.device == torch.device("cpu")


@pytest.mark.parametrize("shapes", [((0, 5), (3, 5)), ((3, 0), (4, 0)), ((3, 5), (0, 5))])
def test_f8_zero_size(shapes):
    call = validate_accumulate(fp8(*shapes[0]), fp8(*shapes[1], E5M2), use_fast_accum=False)
    assert call.zero_size and call.use_fast_accum is False


@pytest.mark.parametrize("value", [1, 0, None, "yes", numpy.int8(1)])
def test_f8_use_fast_accum_type(value):
    with pytest.raises(TypeError, match="use_fast_accum must be a bool or numpy.bool_"):
        validate_accumulate(fp8(2, 16), fp8(2, 16), use_fast_accum=value)


def test_f8_use_fast_accum_required():
    with pytest.raises(TypeError):
        validate_accumulate(fp8(2, 16), fp8(2, 16))


@pytest.mark.parametrize("dtype", [E4M3FNUZ, E5M2FNUZ, E8M0, torch.float32, torch.uint8])
def test_f8_dtypes(dtype):
    with pytest.raises(TypeError, match="float8_e4m3fn or torch.float8_e5m2.*float8_e4m3fnuz / float8_e5m2fnuz"):
        validate_accumulate(fp8(2, 16), fp8(2, 16, dtype), use_fast_accum=True)
    with pytest.raises(TypeError, match="accumulate: a must be"):
        validate_accumulate(fp8(2, 16, dtype), fp8(2, 16), use_fast_accum=True)


def test_f8_tensors_required():
    with pytest.raises(TypeError, match="a must be a torch.Tensor"):
        validate_accumulate(numpy.zeros((2, 16)), fp8(2, 16), use_fast_accum=True)


def test_f8_two_dimensional():
    with pytest.raises(ValueError, match="b must be a 2-D tensor"):
        validate_accumulate(fp8(2, 16), torch.zeros(16, dtype=E4M3), use_fast_accum=True)
    with pytest.raises(ValueError, match="a must be a 2-D tensor"):
        validate_accumulate(torch.zeros(1, 2, 16, dtype=E4M3), fp8(2, 16), use_fast_accum=True)


def test_f8_same_k():
    with pytest.raises(ValueError, match="same K"):
        validate_accumulate(fp8(2, 16), fp8(16, 2), use_fast_accum=True)


def test_f8_same_device():
    with pytest.raises(ValueError, match="a is on cpu but b is on meta"):
        validate_accumulate(fp8(2, 16), fp8(2, 16).to("meta"), use_fast_accum=True)


def test_f8_grad():
    a = fp8(2, 16).requires_grad_(True)
    with torch.enable_grad():
        with pytest.raises(UnsupportedFeatureError, match="a require.*torch.no_grad"):
            validate_accumulate(a, fp8(2, 16), use_fast_accum=True)
    with torch.no_grad():
        assert validate_accumulate(a, fp8(2, 16), use_fast_accum=True).K == 16


def test_f8_order():
    # a wrong use_fast_accum type wins over a wrong dtype; a wrong dtype over a wrong rank; rank over K; K over device
    with pytest.raises(TypeError, match="use_fast_accum"):
        validate_accumulate(fp8(2, 16, torch.float32), fp8(2, 16), use_fast_accum=1)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        validate_accumulate(torch.zeros(16), fp8(2, 16), use_fast_accum=True)
    with pytest.raises(ValueError, match="2-D"):
        validate_accumulate(fp8(2, 16), torch.zeros(3, dtype=E4M3).to("meta"), use_fast_accum=True)
    with pytest.raises(ValueError, match="same K"):
        validate_accumulate(fp8(2, 16), fp8(2, 8).to("meta"), use_fast_accum=True)
    with torch.enable_grad(), pytest.raises(ValueError, match="a is on"):
        validate_accumulate(fp8(2, 16).requires_grad_(True), fp8(2, 16).to("meta"), use_fast_accum=True)


# ---------------------------------------------------------------------------------------------------------------
# Flush-to-zero refusal (semantics.md (e), last paragraph)
# ---------------------------------------------------------------------------------------------------------------


def test_ftz_check_passes_normally():
    assert not fp32_subnormals_flushed()
    check_no_flush_to_zero()


def test_ftz_check_raises_base_class_when_flushing():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU does not support torch.set_flush_denormal")
    try:
        assert fp32_subnormals_flushed()
        with pytest.raises(MmaemuError, match=r"torch\.set_flush_denormal\(False\)") as info:
            check_no_flush_to_zero()
        assert type(info.value) is MmaemuError
    finally:
        torch.set_flush_denormal(False)
    check_no_flush_to_zero()


def test_ftz_float64_probe_agrees_with_the_numpy_probes(monkeypatch):
    """Where one register bit decides the mode for every width (x86-64, AArch64), the probe is two Python float64
    products; it must read the mode as the numpy fp32 probes do, off and on."""
    from mmaemu.base import fpmode

    if not fpmode._UNIFORM_MODE:
        pytest.skip("the float64 probe is used on x86-64 and AArch64 only")

    def both():
        fast = fpmode.fp32_subnormals_flushed()
        monkeypatch.setattr(fpmode, "_UNIFORM_MODE", False)
        try:
            return fast, fpmode.fp32_subnormals_flushed()
        finally:
            monkeypatch.setattr(fpmode, "_UNIFORM_MODE", True)

    assert both() == (False, False)
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU does not support torch.set_flush_denormal")
    try:
        assert both() == (True, True)
    finally:
        torch.set_flush_denormal(False)
    assert both() == (False, False)


@pytest.mark.subprocess
def test_ftz_check_is_two_numpy_probes_without_torch_or_numba():
    """What keeps the per-call check cheap (a few microseconds; not timed here): it needs neither torch nor Numba,
    only two numpy operations on preallocated probes."""
    import subprocess
    import sys

    code = ("import sys; from mmaemu.plan.flush import check_no_flush_to_zero; check_no_flush_to_zero(); "
            "print('torch' in sys.modules, 'numba' in sys.modules)")
    assert subprocess.check_output([sys.executable, "-c", code], text=True).split() == ["False", "False"]

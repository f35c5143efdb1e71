"""Operand descriptors (mmaemu.plan.descriptors): planning a call on shapes, strides and dtypes without torch.

A descriptor must answer every question validation asks exactly as torch answers it for the tensor it describes,
so that ``mmaemu explain`` (which plans on descriptors on the CPU) reports what ``mmaemu.explain`` reports for
real tensors: checked here against torch tensors of the same metadata, rule by rule and plan by plan.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import mmaemu
from mmaemu.cli import diagnostics
from mmaemu.cli import operands
from mmaemu.plan.descriptors import DeviceDescriptor, TensorDescriptor, TorchName, dtype_name, row_major
from mmaemu.plan import layout as rules
from mmaemu.plan.validate import validate_scaled_mm
from mmaemu.platform import get_profile

CPU = DeviceDescriptor("cpu")
REPO = pathlib.Path(__file__).resolve().parents[1]


def describe(tensor: torch.Tensor) -> TensorDescriptor:
    """The descriptor of a CPU tensor's metadata."""
    return TensorDescriptor(tuple(tensor.shape), tuple(tensor.stride()), TorchName(dtype_name(tensor.dtype)), CPU,
                            tensor.storage_offset())


def strided(shape, strides, offset=0, dtype=torch.float8_e4m3fn):
    """A CPU tensor of ``shape``/``strides`` at ``offset`` over a zero buffer large enough for it."""
    extent = offset + 1 + sum((size - 1) * stride for size, stride in zip(shape, strides) if size > 0)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return torch.zeros(extent * itemsize, dtype=torch.uint8).view(dtype).as_strided(shape, strides, offset)


# Layouts of a [R, C] matrix: row-major, padded row-major, column-major, padded column-major, neither-major, and
# the degenerate shapes (a single row or column, empty) where torch's contiguity rule ignores some strides.
LAYOUTS = [((4, 32), (32, 1)), ((4, 32), (48, 1)), ((32, 4), (1, 32)), ((32, 4), (1, 48)), ((4, 32), (64, 2)),
           ((1, 32), (32, 1)), ((1, 32), (7, 1)), ((32, 1), (1, 1)), ((32, 1), (1, 9)), ((1, 1), (5, 3)),
           ((0, 32), (32, 1)), ((32, 0), (1, 1)), ((16, 16), (1, 16)), ((16, 16), (16, 1))]


@pytest.mark.parametrize("shape, strides", LAYOUTS)
@pytest.mark.parametrize("offset", [0, 3, 16])
def test_descriptor_answers_as_torch(shape, strides, offset):
    tensor = strided(shape, strides, offset)
    described = describe(tensor)
    for view, desc in ((tensor, described), (tensor.t(), described.t()), (tensor.contiguous(), described.contiguous())):
        assert desc.shape == tuple(view.shape) and desc.stride() == tuple(view.stride())
        assert [desc.stride(d) for d in range(2)] == [view.stride(d) for d in range(2)]
        assert (desc.dim(), desc.numel(), desc.is_contiguous()) == (view.dim(), view.numel(), view.is_contiguous())
        assert (desc.element_size(), str(desc.dtype), str(desc.device)) == (1, str(view.dtype), str(view.device))
        assert str(desc.layout) == str(view.layout) and desc.requires_grad is view.requires_grad is False
    assert described.contiguous().storage_offset() == (offset if tensor.is_contiguous() else 0)
    for rule in (rules.is_row_major, rules.is_column_major, rules.is_neither_major, rules.mat2_is_column_major,
                 rules.byte_misalignment):
        assert rule(described) == rule(tensor), rule.__name__
    assert rules.is_layout_std(described, described.t()) == rules.is_layout_std(tensor, tensor.t())
    if shape[0] and shape[1]:
        assert rules.leading_dimensions(described, described.t()) == rules.leading_dimensions(tensor, tensor.t())


def test_row_major_and_scalars_match_torch():
    for shape in [(), (1,), (0, 16), (16, 0), (3, 5), (2, 3, 4)]:
        zeros = torch.zeros(shape, dtype=torch.float32)
        desc = row_major(shape, TorchName("float32"), CPU)
        assert (desc.shape, desc.stride(), desc.numel(), desc.dim()) == (
            tuple(zeros.shape), zeros.stride(), zeros.numel(), zeros.dim())
        assert desc.is_contiguous() and desc.element_size() == zeros.element_size() == 4
    assert str(TorchName("bfloat16")) == repr(TorchName("bfloat16")) == str(torch.bfloat16)
    assert str(DeviceDescriptor("cuda", 1)) == str(torch.device("cuda", 1))


def _outcome(fn, *args, **kwargs):
    """The comparable part of validate_scaled_mm's result: its flags, or the refusal (type and message)."""
    try:
        call = fn(*args, **kwargs)
    except Exception as exc:  # the refusal is what is compared
        return type(exc).__name__, str(exc)
    return (call.M, call.N, call.K, call.fmt_a, call.fmt_b, str(call.out_dtype), call.zero_size, call.layout_std,
            call.input_copied, call.out_column_major, call.out_unusable, getattr(call.recipe, "name", None))


DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float32]
# input [M, K = 32]: row-major, padded, neither-major (copied), column-major (refused), one row, misaligned lda
INPUT_LAYOUTS = [((4, 32), (32, 1)), ((4, 32), (48, 1)), ((4, 32), (64, 2)), ((4, 32), (1, 4)),
                 ((1, 32), (7, 1)), ((4, 32), (40, 1))]
# mat2 [K = 32, N]: column-major, padded, row-major (refused), ldb not a multiple of 16, N = 8, one column
MAT2_LAYOUTS = [((32, 16), (1, 32)), ((32, 16), (1, 48)), ((32, 16), (16, 1)), ((32, 16), (1, 40)),
                ((32, 8), (1, 32)), ((32, 1), (1, 32))]


@pytest.mark.parametrize("a_layout", INPUT_LAYOUTS)
@pytest.mark.parametrize("b_layout", MAT2_LAYOUTS)
def test_validation_of_descriptors_is_validation_of_tensors(a_layout, b_layout):
    """Every refusal and flag of validate_scaled_mm, for descriptors and tensors of the same metadata."""
    profile = get_profile("hopper")
    out_dtypes = [None, torch.bfloat16, torch.float8_e5m2, torch.int32]
    for a_dtype, b_dtype, out_dtype, offset in itertools.product(DTYPES, DTYPES[:2], out_dtypes, [0, 8, 16]):
        a = strided(*a_layout, offset, a_dtype)
        b = strided(*b_layout, 0, b_dtype)
        scale = torch.ones((), dtype=torch.float32)
        desc_out = None if out_dtype is None else TorchName(dtype_name(out_dtype))
        expected = _outcome(validate_scaled_mm, a, b, scale, scale, out_dtype=out_dtype, profile=profile)
        got = _outcome(validate_scaled_mm, describe(a), describe(b), describe(scale), describe(scale),
                       out_dtype=desc_out, profile=profile)
        assert got == expected, (a_dtype, b_dtype, out_dtype, offset)


SHAPES = [(64, 5760, 1920), (16, 256, 128), (0, 16, 16), (16, 16, 0), (1, 16, 16), (16, 17, 16), (16, 16, 8),
          (48, 64, 5760), (65536, 65536, 65536), (2048, 2048, 16384)]
OPTIONS = [dict(), dict(a="e5m2"), dict(a="e5m2", b="e5m2"), dict(out="bf16", fast=True), dict(out="e5m2"),
           dict(out="fp32", splitk=(2, "contiguous")), dict(out="fp32", splitk=(2, "serial")),
           dict(splitk="assume-unsplit"), dict(splitk=1, backend="cuda"), dict(splitk=1, backend="nope"),
           dict(splitk=1, profile="ada"), dict(profile="nope"), dict(scale_result=2.0, splitk=1), dict(splitk=3)]


@pytest.mark.parametrize("shape", SHAPES)
def test_explain_on_descriptors_is_explain_on_tensors(shape):
    """``mmaemu explain``'s CPU plan (descriptors) equals the plan of mmaemu.explain on zero tensors."""
    for options in OPTIONS:
        args = dict(a="e4m3", b="e4m3", out=None, fast=False, scale_a=1.0, scale_b=1.0, scale_result=None,
                    profile="hopper", splitk="auto", backend="auto")
        args.update(options)
        ordered = [args[name] for name in ("a", "b", "out", "fast", "scale_a", "scale_b", "scale_result", "profile",
                                           "splitk", "backend")]
        described = operands.explain_call(*shape, *ordered, operands.CPU)
        expected = operands.explain_call(*shape, *ordered, torch.device("cpu"))
        assert described == expected, options


def test_explain_of_descriptors_matches_the_api():
    """The CLI's descriptor path gives what the public mmaemu.explain gives for the same tensors."""
    a = torch.zeros((64, 1920), dtype=torch.float8_e4m3fn)
    b = torch.zeros((5760, 1920), dtype=torch.float8_e4m3fn).t()
    one = torch.ones((), dtype=torch.float32)
    expected = mmaemu.explain(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=True)
    got = operands.explain_call(64, 5760, 1920, "e4m3", "e4m3", "bf16", True, 1.0, 1.0, None, None, "auto", "auto",
                                operands.CPU)
    assert got == expected and got.validation == "ok"


# The invocations that must not import torch: the CPU device, "auto" where CUDA is off, help texts.
_TORCH_FREE = [["explain", "64", "5760", "1920", "--out", "bf16", "--fast", "--device", "cpu"],
               ["explain", "16", "256", "128", "--device", "cpu", "--json", "-"],
               ["explain", "0", "16", "16", "--device", "cpu"],
               ["explain", "16", "16", "8", "--device", "cpu"],
               ["--help"], ["explain", "--help"]]
_WORKER = """
import json, sys
from mmaemu import cli
codes = []
for argv in json.loads(sys.argv[1]):
    try:
        cli.main(argv)
    except SystemExit as exit:
        codes.append(exit.code)
print(json.dumps({"codes": codes, "torch": "torch" in sys.modules}), file=sys.stderr)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("disable_cuda", [False, True])
def test_explain_on_the_cpu_does_not_import_torch(disable_cuda):
    """``python -m mmaemu explain`` plans a CPU call without importing torch (seconds of start-up); so does "auto"
    where CUDA is disabled or no CUDA driver is installed."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("MMAEMU_") or name == "MMAEMU_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    invocations = list(_TORCH_FREE)
    if disable_cuda:
        env["MMAEMU_DISABLE_CUDA"] = "1"
    if disable_cuda or diagnostics.cuda_driver_absent():
        invocations.append(["explain", "16", "256", "128", "--splitk", "1"])
    proc = subprocess.run([sys.executable, "-c", _WORKER, json.dumps(invocations)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["codes"] == [0, 1, 0, 1, 0, 0] + [0] * (len(invocations) - 6)
    assert report["torch"] is False


def test_cuda_driver_absent_reads_the_driver_and_the_switch(monkeypatch):
    from mmaemu.base import device_facts

    def missing():
        raise device_facts.CublasLtError("libcuda not found")

    monkeypatch.delenv("MMAEMU_DISABLE_CUDA", raising=False)
    monkeypatch.setattr(device_facts, "load_libcuda", missing)
    assert diagnostics.cuda_driver_absent() is True
    monkeypatch.setattr(device_facts, "load_libcuda", lambda: object())
    assert diagnostics.cuda_driver_absent() is False
    monkeypatch.setenv("MMAEMU_DISABLE_CUDA", "1")
    assert diagnostics.cuda_driver_absent() is True

"""explain says what scaled_mm will do: every refusal of the call is found by the plan, before anything is
computed, with the rule named (FTZ mode, meta / sparse / nested tensors, an out= that cannot take the result)."""

import numpy as np
import pytest
import torch

import mmaemu
from mmaemu.recipes import tensorwise
from mmaemu.errors import MmaemuError, ReferenceRejectsError
from mmaemu.testing import assert_bitwise_equal

ONE = torch.tensor(1.0)


def fp8(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)


A, W = fp8((4, 32), 1), fp8((16, 32), 2)


@pytest.fixture
def nothing_is_computed(monkeypatch):
    """A refused call must fail in the plan: reaching the engine is a failure."""
    def engine(*args, **kwargs):
        raise AssertionError("the GEMM was computed before the call was refused")

    monkeypatch.setattr(tensorwise, "_accumulator", engine)


def refusal(call, **kwargs):
    """(exception class name, message) of the call, asserting explain reports exactly that."""
    plan = mmaemu.explain(*call, **kwargs)
    with pytest.raises(Exception) as info:
        mmaemu.scaled_mm(*call, **kwargs)
    error = info.value
    message = error.args[0] if isinstance(error, KeyError) else str(error)
    assert plan.validation == (type(error).__name__, message)
    return type(error), message


def test_flush_to_zero_mode_is_refused_by_the_plan(nothing_is_computed):
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        error, message = refusal((A, W.t(), ONE, ONE), out_dtype=torch.float32, splitk=1)
        assert error is MmaemuError and "set_flush_denormal(False)" in message
        with pytest.raises(MmaemuError):
            mmaemu.accumulate(A, W, use_fast_accum=True, splitk=1)
    finally:
        torch.set_flush_denormal(False)


def _sparse_scale():
    return torch.tensor([1.0]).to_sparse()


def _nested():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "the nested tensor API is in prototype stage"
        return torch.nested.nested_tensor([torch.zeros(4, 32), torch.zeros(4, 32)])


@pytest.mark.parametrize("position,make,kind", [
    (0, lambda: A.to("meta"), "meta"),
    (2, _sparse_scale, "sparse"),
    (3, _sparse_scale, "sparse"),
    (0, _nested, "nested"),
], ids=["meta-call", "sparse-scale_a", "sparse-scale_b", "nested-input"])
def test_meta_sparse_and_nested_tensors_are_type_errors(nothing_is_computed, position, make, kind):
    call = [A, W.t(), ONE, ONE] if kind != "meta" else [A.to("meta"), W.t().to("meta"), ONE.to("meta"),
                                                        ONE.to("meta")]
    call[position] = make()
    error, message = refusal(tuple(call), out_dtype=torch.float32, splitk=1)
    assert error is TypeError and kind in message and "dense" in message


def test_meta_tensors_meet_the_device_rule_first():
    """torch validates meta calls too: a meta operand next to CPU ones is refused by the same-device rule."""
    plan = mmaemu.explain(A, W.t().to("meta"), ONE, ONE, out_dtype=torch.float32, splitk=1)
    assert plan.validation[0] == "ReferenceRejectsError" and "same device" in plan.validation[1]


def test_meta_calls_and_accumulate_operands_are_type_errors(nothing_is_computed):
    meta = [t.to("meta") for t in (A, W.t(), ONE, ONE)]
    error, message = refusal(tuple(meta), out_dtype=torch.float32, splitk=1, out=torch.empty(4, 16, device="meta"))
    assert error is TypeError and "input is a meta tensor" in message
    with pytest.raises(TypeError, match="meta"):
        mmaemu.accumulate(A.to("meta"), W.to("meta"), use_fast_accum=True, splitk=1)
    with pytest.raises(TypeError, match="meta"):  # also when nothing would be computed
        mmaemu.scaled_mm(torch.empty(0, 32, dtype=torch.float8_e4m3fn, device="meta"), *meta[1:])


def test_out_that_cannot_grow_is_refused_before_computing(nothing_is_computed):
    small = torch.from_numpy(np.zeros(3, np.float32))  # numpy memory: torch cannot resize its storage
    error, message = refusal((A, W.t(), ONE, ONE), out_dtype=torch.float32, splitk=1, out=small)
    assert error is ReferenceRejectsError and "not resizable" in message and "[4, 16]" in message


def test_out_whose_storage_is_large_enough_is_resized_in_place():
    expected = mmaemu.scaled_mm(A, W.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)
    roomy = torch.from_numpy(np.zeros(64, np.float32))  # not resizable, but [4, 16] fits
    plan = mmaemu.explain(A, W.t(), ONE, ONE, out_dtype=torch.float32, splitk=1, out=roomy)
    assert plan.validation == "ok"
    with pytest.warns(UserWarning, match="resized"):
        got = mmaemu.scaled_mm(A, W.t(), ONE, ONE, out_dtype=torch.float32, splitk=1, out=roomy)
    assert got is roomy
    assert_bitwise_equal(roomy, expected)


def test_out_requiring_grad_is_refused_under_grad_mode_and_filled_under_no_grad(nothing_is_computed, monkeypatch):
    out = torch.zeros(4, 16, requires_grad=True)
    error, message = refusal((A, W.t(), ONE, ONE), out_dtype=torch.float32, splitk=1, out=out)
    assert error is ReferenceRejectsError and "out" in message and "no_grad" in message
    monkeypatch.undo()  # compute for real now
    expected = mmaemu.scaled_mm(A, W.t(), ONE, ONE, out_dtype=torch.float32, splitk=1)
    with torch.no_grad():  # torch accepts it here, resizing included
        for target in (out, torch.zeros(2, 2, requires_grad=True)):
            assert mmaemu.explain(A, W.t(), ONE, ONE, out_dtype=torch.float32, splitk=1, out=target).validation \
                == "ok"
            with pytest.warns(UserWarning) if target.shape != (4, 16) else _nothing():
                got = mmaemu.scaled_mm(A, W.t(), ONE, ONE, out_dtype=torch.float32, splitk=1, out=target)
            assert got is target and target.requires_grad
            assert_bitwise_equal(target.detach(), expected)


def _nothing():
    import contextlib

    return contextlib.nullcontext()

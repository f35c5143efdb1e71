"""Argument validation of ``scaled_mm`` and ``accumulate`` (semantics.md section (f); platform.md sections 1, 2, 9).

:func:`validate_scaled_mm` refuses exactly the calls torch 2.7.1 + cuBLASLt 12.8.3.14 refuse, in the same order
(the first failing rule raises):

* f.1 Python types -> ``TypeError`` (and, mmaemu's addition, sparse or nested tensors -> ``TypeError``);
* f.2 torch ``_scaled_mm`` checks (1-14) -> :class:`~mmaemu.errors.ReferenceRejectsError`, then the two ways
  torch 2.7.1 fails on ``out=`` before its early return (autograd, resize_output) -> ``ReferenceRejectsError``,
  then (mmaemu's addition) meta tensors, which hold no data -> ``TypeError``;
* f.3 zero-size early return (M, N or K = 0): nothing later applies;
* f.4 cuBLAS/cuBLASLt-level checks (1-6) -> ``ReferenceRejectsError``;
* f.5 the profile's rejection rules -> ``ReferenceRejectsError`` (message ends with ``[profile <name>]``);
* f.6 valid but not modelled (a bias with tensor-wise scales, autograd) ->
  :class:`~mmaemu.errors.UnsupportedFeatureError`.

A block-wise call (torch 2.13's 1x128 / 128x128 fp32 scales, recognised on the block-wise profile only: on the
others torch 2.7.1's "Invalid scaling configuration" names that profile) leaves this order after f.3 for
:func:`mmaemu.plan.blockwise.check_blockwise_call`.

A row-wise call (scale_a [M, 1], scale_b [1, N]) leaves this order after f.3, as torch 2.7.1 sends it to its
CUTLASS kernel before any cuBLASLt argument handling: its rules are :func:`mmaemu.plan.rowwise.check_rowwise_call`
(bf16 output, the kernel's ``check_inputs``, the platforms it is modelled on), then the no-grad rule.

Which of those branches a call takes is found once: at f.2.4-5 the first recipe of :data:`mmaemu.recipes.RECIPES`
that recognises the scales, whose ``validate`` applies its rules after f.3 and returns the call spec carrying it
(``call.recipe``); the rules themselves are functions of :mod:`mmaemu.plan.rules` and of the recipes' rule modules.

:func:`validate_accumulate` applies the few rules of f.8. Neither function decides split-K, picks a backend,
warns (f.7) or computes.

Message convention: torch's own wording where there is one, what was passed, the way out, and a closing tag
naming who refuses: ``[torch 2.7.1 _scaled_mm]``, ``[cuBLASLt 12.8.3.14]``, ``[profile <name>]`` or
``[mmaemu scope]``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy

from ..recipes import RECIPES
from ..base.tensor_kinds import require_data, require_dense
from .layout import is_layout_std
from .rules import (
    FP8_FORMAT_OF_DTYPE_NAME,
    ScaledMMCall,
    _check_bias_dtype,
    _check_bias_size,
    _check_divisible_by_16,
    _check_float8_operands,
    _check_fp4_fast_accum,
    _check_matrices,
    _check_no_grad,
    _check_out_receives,
    _check_python_types,
    _check_same_device,
    _check_scale_result,
    _effective_out_dtype,
    _fp8_format,
    _is_tensor,
    _named_tensors,
    _out_resize,
    _torch_rejects,
    split_key,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "ScaledMMCall",
    "AccumulateCall",
    "validate_scaled_mm",
    "validate_accumulate",
    "split_key",
    "FP8_FORMAT_OF_DTYPE_NAME",
]


@dataclasses.dataclass(frozen=True, eq=False)
class AccumulateCall:
    """An ``accumulate`` call that passed validation (f.8): a [M, K] x b [N, K]^T, fp32 accumulator only.

    ``use_fast_accum`` is a Python bool (a numpy.bool_ argument is converted); ``zero_size`` means M, N or K is
    0 (the result is +0 everywhere, or empty).
    """

    a: torch.Tensor = dataclasses.field(repr=False)
    b: torch.Tensor = dataclasses.field(repr=False)
    M: int
    N: int
    K: int
    fmt_a: str
    fmt_b: str
    use_fast_accum: bool
    zero_size: bool
    device: torch.device


# ----------------------------------------------------------------------------------------------------------------
# scaled_mm
# ----------------------------------------------------------------------------------------------------------------

def validate_scaled_mm(
    input: Any,
    mat2: Any,
    scale_a: Any,
    scale_b: Any,
    bias: Any = None,
    scale_result: Any = None,
    out_dtype: Any = None,
    use_fast_accum: Any = False,
    out: Any = None,
    *,
    profile: Any,
    global_scales: Any = None,
) -> ScaledMMCall:
    """Validate a ``scaled_mm`` call exactly as torch 2.7.1 + cuBLASLt 12.8.3.14 would (semantics.md f.1-f.6).

    ``profile`` needs ``.name`` and ``.rejection(fmt_a, fmt_b, out_dtype_name) -> RejectRule | None``
    (platform.md section 1). Raises TypeError, ReferenceRejectsError or UnsupportedFeatureError for the first
    failing rule; returns a :class:`ScaledMMCall` otherwise. Block scales (MXFP8, NVFP4; ``global_scales``:
    NVFP4's pair of fp32 global scales or None) follow :mod:`.block_scaled` from f.2.4 on.
    """
    # f.1 Python types
    _check_python_types(input, mat2, scale_a, scale_b, bias, scale_result, out, out_dtype, use_fast_accum)

    # f.2 torch _scaled_mm checks, in torch's order
    _check_matrices(input, mat2)  # f.2.1-3
    M, K = input.shape
    N = mat2.shape[1]
    recipe, scales = _recipe_of_scales(input, mat2, scale_a, scale_b, profile)  # f.2.4-5 (B.1: block scales)
    _check_scale_result(scale_result)  # f.2.6
    _check_bias_size(bias, N)  # f.2.7
    _check_divisible_by_16(M, K, N)  # f.2.8-9
    od = _effective_out_dtype(input, out, out_dtype)  # f.2.10
    _check_float8_operands(input, mat2, fp4=recipe.fp4_operands)  # f.2.11-12
    if recipe.fp4_operands:
        _check_fp4_fast_accum(input, mat2, use_fast_accum)
    _check_bias_dtype(bias, od)  # f.2.13
    _check_same_device(input, mat2, scale_a, scale_b, bias, scale_result, out)  # f.2.14
    for name, g in zip(("global_scale_a", "global_scale_b"), global_scales or ()):
        if _is_tensor(g) and g.device != input.device:
            raise _torch_rejects(f"Expected all tensors to be on the same device: {name} is on {g.device} but mat1 "
                                 f"(input) is on {input.device}; move it with .to(input.device)")
    _check_out_receives(out, M, N)  # torch's autograd check of out= and resize_output (before f.3)
    for name, value in _named_tensors(input, mat2, scale_a, scale_b, bias, scale_result, out):
        require_data("scaled_mm", name, value)  # mmaemu's addition: meta tensors hold nothing to compute on

    common = dict(
        M=M, N=N, K=K, out_dtype=od, scale_a=scale_a, scale_b=scale_b, scale_result=scale_result,
        use_fast_accum=use_fast_accum, out=out, device=input.device,
    )

    # f.3 zero-size early return: no cuBLAS, profile or scope rule applies
    if M == 0 or N == 0 or K == 0:
        return _zero_size_call(input, mat2, **common)

    # the recipe's own rules (a row-wise call goes to torch 2.7.1's CUTLASS kernel before any cuBLASLt argument
    # handling; a tensor-wise call meets f.4-f.6), and its call spec
    return recipe.validate(input, mat2, scales, bias, profile, global_scales, common)


def _recipe_of_scales(input, mat2, scale_a, scale_b, profile):
    """f.2.4-5, torch's scaling type (B.1 for block scales): ``(recipe, what it found)`` of the first recipe of
    :data:`mmaemu.recipes.RECIPES` (torch's order) that recognises the scales. A recogniser raises for scales of
    its kind that torch refuses; the row-wise one refuses every scale that is neither row- nor tensor-wise, so the
    tensor-wise recipe, last, recognises what is left."""
    for recipe in RECIPES:
        found = recipe.recognise(input, mat2, scale_a, scale_b, profile)
        if found is not None:
            return recipe, found
    raise AssertionError("the tensor-wise recipe recognises every scale that reaches it")


def _zero_size_call(input, mat2, **common) -> ScaledMMCall:
    """f.3: M, N or K = 0 returns at once (empty, or +0 for K = 0), for every dtype and scale that passed f.2."""
    resize, resize_warns = _out_resize(common["out"], common["M"], common["N"])
    return ScaledMMCall(
        input=input, mat2=mat2,
        fmt_a=_fp8_format(input.dtype), fmt_b=_fp8_format(mat2.dtype),
        zero_size=True, layout_std=is_layout_std(input, mat2), input_copied=False,
        out_column_major=False, out_unusable=False, out_resize=resize, out_resize_warns=resize_warns,
        **common,
    )


# ----------------------------------------------------------------------------------------------------------------
# accumulate
# ----------------------------------------------------------------------------------------------------------------


def validate_accumulate(a: Any, b: Any, *, use_fast_accum: Any) -> AccumulateCall:
    """Validate ``accumulate(a, b, *, use_fast_accum)`` (semantics.md f.8): a [M, K] x b [N, K]^T.

    No torch, cuBLAS or profile rule applies: any K, layout or alignment, and E5M2 x E5M2, are computed.
    """
    if not isinstance(use_fast_accum, (bool, numpy.bool_)):
        raise TypeError(
            f"accumulate: use_fast_accum must be a bool or numpy.bool_, got {type(use_fast_accum).__name__}"
        )
    for name, tensor in (("a", a), ("b", b)):
        _check_accumulate_operand_type(name, tensor)
    for name, tensor in (("a", a), ("b", b)):
        if tensor.dim() != 2:
            raise ValueError(
                f"accumulate: {name} must be a 2-D tensor ({'[M, K]' if name == 'a' else '[N, K]'}), got shape "
                f"{list(tensor.shape)}"
            )
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"accumulate: a [M, K] and b [N, K] must have the same K, got a {list(a.shape)} and b "
            f"{list(b.shape)}; b is [N, K] (pass w.t() if you hold a [K, N] matrix w)"
        )
    if a.device != b.device:
        raise ValueError(f"accumulate: a is on {a.device} but b is on {b.device}; put both on one device")
    for name, tensor in (("a", a), ("b", b)):
        require_data("accumulate", name, tensor)
    _check_no_grad({"a": a, "b": b})
    M, K = a.shape
    N = b.shape[0]
    return AccumulateCall(
        a=a, b=b, M=M, N=N, K=K, fmt_a=_fp8_format(a.dtype), fmt_b=_fp8_format(b.dtype),
        use_fast_accum=bool(use_fast_accum), zero_size=(M == 0 or N == 0 or K == 0), device=a.device,
    )


def _check_accumulate_operand_type(name: str, tensor: Any) -> None:
    """f.8: a and b are float8_e4m3fn or float8_e5m2 tensors (TypeError; the fnuz formats are named)."""
    if not _is_tensor(tensor):
        raise TypeError(f"accumulate: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    require_dense("accumulate", name, tensor)
    if _fp8_format(tensor.dtype) is None:
        raise TypeError(
            f"accumulate: {name} must be torch.float8_e4m3fn or torch.float8_e5m2, got {tensor.dtype} (the fnuz "
            f"formats float8_e4m3fnuz / float8_e5m2fnuz and float8_e8m0fnu are not modelled)"
        )

"""The row-wise recipe: fp32 scales per row of input ([M, 1]) and per column of mat2 ([1, N]), and a bf16 bias
(torch 2.7.1's ``RowWise``), computed as torch's CUTLASS kernel ``f8f8bf16_rowwise`` does on sm_90
(:mod:`mmaemu.platform.rowwise`).

* Recognised: scale_a [M, 1] and scale_b [1, N], contiguous fp32 (torch's get_scaling_type, f.2.4-5: every other
  scale that is not one element each is refused here, with the block-wise hint where it applies).
* Rules: the kernel's own (:func:`mmaemu.plan.rowwise.check_rowwise_call`), then no grad.
* Plan: experimental (a warning), one CTA per output over all of K (S = 1), the scale order of the epilogue in the
  split note (:func:`mmaemu.platform.rowwise.scale_order`); the engines of the tensor-wise recipe.
* Host preparation and kernels: the tensor-wise accumulator (:func:`mmaemu.recipes.tensorwise._accumulator`).
  Epilogue: torch's row-wise epilogue (:mod:`mmaemu.arith.rowwise`, :func:`rowwise_epilogue`, also the grouped
  GEMM's).
"""

from __future__ import annotations

from ..arith.params import require_gemm_level
from ..base._untraced import plain_tensor
from ..errors import UnsupportedFeatureError
from ..platform import rowwise
from ..platform.splitk import SplitDecision, asks_one_split
from ..plan import rules, steps
from ..plan.blockwise import blockwise_hint
from ..plan.rowwise import check_rowwise_call
from ._torch import torch_for
from .base import Recipe
from .tensorwise import _PREPARED_MIN_CODES, _accumulator, _codes_rows, _plain_data

torch = torch_for(globals())

__all__ = ["ROWWISE", "RowwiseRecipe", "rowwise_epilogue"]


def _bits(t: torch.Tensor, view):  # the numpy array of the tensor's bits, as ``view``
    return t.detach().contiguous().reshape(-1).view(view).cpu().numpy()


def rowwise_epilogue(acc: torch.Tensor, scale_a, scale_b, bias, x_first: bool, context) -> torch.Tensor:
    """bf16 output [M, N] of torch's row-wise epilogue (:mod:`mmaemu.arith.rowwise`) of the fp32 accumulators
    ``acc`` with fp32 scales ``scale_a`` [M] and ``scale_b`` [N] (any shape holding them in order), a bf16
    ``bias`` [N] or None and the scale order ``x_first`` (:func:`mmaemu.platform.rowwise.scale_order`), on the
    accumulator's device: the one row-wise epilogue of ``scaled_mm``'s row-wise recipe and of the grouped GEMM
    (:mod:`mmaemu.grouped`). An accumulator on a CUDA device is offered to the recipe's epilogue kernel
    (:func:`mmaemu.cuda.rowwise_epilogue`, with ``context``'s verdicts); that kernel has no device self-test yet, so
    no GPU runs it and the CPU loops compute, the result copied back to the accumulator's device."""
    if acc.device.type == "cuda":
        from .. import cuda as cuda_backend

        outcome = cuda_backend.rowwise_epilogue(acc, scale_a, scale_b, bias, x_first, context=context)
        if outcome.result is not None:
            return outcome.result
    from ..cpu import rowwise_epilogue_codes

    bias_bits = None if bias is None else _bits(bias, torch.uint16)
    bits = rowwise_epilogue_codes(acc.cpu().numpy(), _bits(scale_a, torch.uint32), _bits(scale_b, torch.uint32),
                                  bias_bits, x_first)
    return torch.from_numpy(bits).view(torch.bfloat16).to(acc.device)


def _rowwise_epilogue(acc: torch.Tensor, call, context) -> torch.Tensor:
    """The row-wise recipe's epilogue of a ``scaled_mm`` call: :func:`rowwise_epilogue` in the scale order of the
    call's shape."""
    from ..platform.rowwise import scale_order

    return rowwise_epilogue(acc, call.scale_a, call.scale_b, call.bias, scale_order(call.M, call.N).x_first, context)


class RowwiseRecipe(Recipe):
    """Per-row and per-column fp32 scales, torch's CUTLASS kernel (module docstring)."""

    name = "rowwise"
    takes_bias = True

    def recognise(self, input, mat2, scale_a, scale_b, profile):
        M, N = input.shape[0], mat2.shape[1]
        hint = blockwise_hint(input, mat2, scale_a, scale_b)
        return True if rules._is_rowwise_scaling(scale_a, scale_b, M, N, hint) else None

    def validate(self, input, mat2, found, bias, profile, global_scales, common):
        return _rowwise_call(input, mat2, bias, profile, **common)

    def pair(self, call) -> str:
        return "rowwise_rowwise"

    def plan(self, plan, splitk, backend, context):
        steps.refuse_block_scaled_preset(plan)
        steps.maturity_warnings(plan)
        return _plan_rowwise(plan, splitk, backend, context)

    def run(self, plan, weights=None):
        kept = _kept_cpu_call(plan, weights)
        if kept is not None:
            return kept
        call = plan.call
        acc, _ = _accumulator(plan, call.input, call.mat2.t(), call.fmt_a, call.fmt_b, call.use_fast_accum, weights)
        return _rowwise_epilogue(acc, call, plan.context)


def _kept_cpu_call(plan, weights):
    """The bf16 output of a kept row-wise plan on the cpu backend (``plan.cpu_gemm``, set by :mod:`mmaemu.plan.cache`),
    or None where the plan has none or a tensor is not plain data: the codes and the scales' and bias's values to
    :func:`kept_rowwise_call`."""
    from ..platform.rowwise import scale_order

    gemm = getattr(plan, "cpu_gemm", None)
    call = plan.call
    if gemm is None or not _plain_data(call) or (call.bias is not None and not plain_tensor(call.bias)):
        return None
    return kept_rowwise_call(gemm, _codes_rows(call.input), _bits(call.scale_a, torch.float32),
                             _bits(call.scale_b, torch.float32), _bias_values(call.bias, call.N),
                             scale_order(call.M, call.N).x_first, call.mat2.t(), weights)


def kept_rowwise_call(gemm, a_codes, x_values, w_values, bias_values, x_first: bool, b_rows, weights):
    """The bf16 output [M, N] of a kept row-wise plan's compiled call ``gemm`` (:class:`mmaemu.cpu.fused.
    TensorwiseGemm` with :class:`mmaemu.cpu.fused.RowwiseScales`): A's codes [M, K] (uint8), the fp32 values of
    scale_a [M], scale_b [N] and the bias [N] (:func:`_bias_values`), the scale order of the call's shape, B [N, K]
    (``b_rows``, a CPU float8 tensor: ``mat2.t()``) and where its prepared panels are kept (``weights``, or None).
    Its bits are those of :func:`_accumulator` then :func:`_rowwise_epilogue` (the same products and NaN/Inf rule,
    then :func:`mmaemu.arith.rowwise.rowwise_epilogue_span` per row). The one kept row-wise call of
    :func:`_kept_cpu_call` and of the row-wise layer's decoding step (:class:`mmaemu.nn_recipes.RowwiseFP8Linear`)."""
    from ..cpu.fused import RowwiseScales

    b_codes = _codes_rows(b_rows)
    if weights is not None and b_codes.size < _PREPARED_MIN_CODES:
        weights = None
    bits = gemm.run(a_codes, b_codes, RowwiseScales(x_values, w_values, bias_values, x_first), weights, b_rows)
    return torch.from_numpy(bits).view(torch.bfloat16)


def _bias_values(bias, N: int):
    """The fp32 values [N] (float32) of a bf16 ``bias``, widened exactly from its bits (a bf16 pattern is the top
    half of the fp32 pattern of the same value); no bias: +0 for every column (the kernel adds +0)."""
    import numpy

    if bias is None:
        return numpy.zeros(N, numpy.float32)
    return (_bits(bias, torch.uint16).astype(numpy.uint32) << 16).view(numpy.float32)


def _rowwise_call(input, mat2, bias, profile, **common) -> rules.ScaledMMCall:
    """A row-wise call after f.3: the kernel's own checks (:mod:`mmaemu.plan.rowwise`), then the no-grad rule of
    f.6."""
    check_rowwise_call(input, mat2, common["scale_a"], common["scale_b"], bias, common["out"], common["out_dtype"],
                       profile)
    rules._check_no_grad(dict(input=input, mat2=mat2, scale_a=common["scale_a"], scale_b=common["scale_b"],
                              scale_result=common["scale_result"], bias=bias))
    resize, resize_warns = rules._out_resize(common["out"], common["M"], common["N"])
    return rules.ScaledMMCall(
        input=input, mat2=mat2, fmt_a=rules._fp8_format(input.dtype), fmt_b=rules._fp8_format(mat2.dtype),
        zero_size=False, layout_std=True, input_copied=False, out_column_major=False, out_unusable=False,
        out_resize=resize, out_resize_warns=resize_warns, bias=bias, **common, recipe=ROWWISE,
    )


def _plan_rowwise(plan: steps.Plan, splitk, backend, context) -> steps.Plan:
    """A row-wise call (torch's CUTLASS kernel, :mod:`mmaemu.platform.rowwise`): experimental; one CTA per output
    over all of K, so S = 1 whatever the shape; the scale order of the epilogue is in the split note."""
    call = plan.call
    steps.note(plan, [rowwise.rowwise_maturity_notice()])
    steps.out_resized_warning(plan)
    if not asks_one_split(splitk):
        raise UnsupportedFeatureError(
            f"splitk={splitk!r}: torch 2.7.1's row-wise kernel never splits K ({rowwise.NO_SPLIT_REASON}); use "
            f"splitk='auto' or 1"
        )
    require_gemm_level(plan.preset, call.use_fast_accum)
    order = rowwise.scale_order(call.M, call.N)
    plan.kernel = rowwise.KERNEL
    plan.split = SplitDecision(1, "none", "kernel", False, None, f"{rowwise.NO_SPLIT_REASON}; {order.note}")
    steps.choose_backend(plan, call.device, backend, call.fmt_a, call.fmt_b, context)
    return plan


ROWWISE = RowwiseRecipe()

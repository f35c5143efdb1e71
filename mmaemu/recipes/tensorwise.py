"""The tensor-wise recipe: one fp32 scale per operand (torch 2.7.1's ``TensorWise``), the GEMM of cuBLASLt 12.8
(semantics.md sections (a)-(e)).

* Recognised: what no recipe before it in :data:`mmaemu.recipes.RECIPES` took (the row-wise recogniser refuses
  every scale that is neither tensor- nor row-wise).
* Rules (f.4-f.6, :mod:`mmaemu.plan.rules`): cuBLASLt's layout (a neither-major input is copied), dtypes,
  alignment and leading dimensions, the profile's rejections, then mmaemu's scope (no bias, no grad).
* Plan: the maturity warnings, ``out=`` handling, the split-K decision of the profile's recorded tables and the
  engine (:mod:`mmaemu.plan.steps`).
* Host preparation: the operands' uint8 codes, row-major (:func:`_codes_rows`); B's decoded panels are kept between
  calls by the fast CPU engine (:mod:`mmaemu.cpu.prepared`). Kernels: the CPU engines, or the CUDA kernel the
  choice of :func:`mmaemu.cuda.accumulate` takes. Epilogue: semantics.md (e), on the device that computed the
  accumulator where its CUDA epilogue kernel is validated there (:func:`_epilogue`).
"""

from __future__ import annotations

import numpy

from ..base._untraced import plain_tensor
from ..cpu.prepared import transposed_weight_ref
from ..formats import dtype_name
from ..plan import rules, steps
from ..plan.layout import is_layout_std
from ..warn import report
from ._torch import BitsDtypes, torch_for
from .base import Recipe

torch = torch_for(globals())

__all__ = ["TENSORWISE", "TensorwiseRecipe"]

_BITS_DTYPE = BitsDtypes()


def _codes_rows(t: torch.Tensor) -> "numpy.ndarray":  # noqa: F821
    """uint8 codes of a 2-D float8 tensor, C-contiguous, on the CPU (no copy of a contiguous CPU tensor)."""
    if t.requires_grad:
        t = t.detach()
    if not t.is_cpu:
        t = t.cpu()
    return t.contiguous().view(torch.uint8).numpy()


def _codes_columns(t: torch.Tensor) -> "numpy.ndarray":  # noqa: F821
    """:func:`_codes_rows` of ``t.t()`` (the same array) for a 2-D float8 CPU tensor, transposed by numpy rather
    than by torch (a fraction of a microsecond against one)."""
    if t.requires_grad:
        t = t.detach()
    codes = t.view(torch.uint8).numpy().T
    return codes if codes.flags.c_contiguous else numpy.ascontiguousarray(codes)


def _accumulator(plan, a: torch.Tensor, b_rows: torch.Tensor, fmt_a: str, fmt_b: str, fast: bool, weights=None):
    """(fp32 accumulators [M, N] of a [M, K] times b_rows [N, K]^T on the tensors' device, the CUDA kernel that
    computed them or None for a CPU engine). ``weights``: where the fast CPU engine keeps B's prepared panels
    between calls (:mod:`mmaemu.cpu.prepared`), or None."""
    device = a.device
    split = plan.split
    if plan.backend.startswith("cuda"):
        from .. import cuda as cuda_backend

        return cuda_backend.accumulate(plan.backend, a, b_rows, fmt_a, fmt_b, plan.preset, fast, split.S,
                                       split.scheme, context=plan.context)
    from ..cpu import accumulate_codes

    b_codes = _codes_rows(b_rows)
    reference = plan.backend == "reference"
    engine = None if plan.cpu_engine is None else plan.cpu_engine.engine
    prepared = None
    if weights is not None and not reference and b_codes.size >= _PREPARED_MIN_CODES and device.type == "cpu":
        from ..cpu.engine import OFFSET, TILE

        prepared = weights.prepared(OFFSET if engine == "offset" else TILE, fmt_b, b_rows, b_codes)
    acc = accumulate_codes(_codes_rows(a), b_codes, fmt_a, fmt_b, plan.preset, fast, split.S, split.scheme,
                           reference=reference, cpu_engine=engine, prepared_b=prepared)
    acc = torch.from_numpy(acc)
    return (acc if device.type == "cpu" else acc.to(device)), None


# A B of fewer codes is decoded at each call: its decode (about 2 ns a code) costs less than finding and checking
# its kept panels.
_PREPARED_MIN_CODES = 1 << 14


def _scale_bits(scale) -> int:
    """The fp32 bit pattern of a one-element fp32 scale, read as an integer (no float conversion)."""
    return scale.view(torch.int32).item() & 0xFFFFFFFF


def _plain_data(call) -> bool:
    """Whether every tensor of a tensor-wise call is a plain tensor with data (:func:`mmaemu.base._untraced.plain_tensor`):
    then the entry point's refusal of traced tensors has nothing to refuse."""
    return all(t is None or plain_tensor(t) for t in (call.input, call.mat2, call.scale_a, call.scale_b,
                                                      call.scale_result, call.out))


def kept_cpu_call(plan, weights):
    """The output of a kept tensor-wise plan on the cpu backend (``plan.cpu_gemm``, set by :mod:`mmaemu.plan.cache`
    for such plans only), or None where the plan has none or a tensor is not plain data: :func:`run_cpu_gemm` of
    the plan's tensors."""
    gemm = getattr(plan, "cpu_gemm", None)
    call = plan.call
    if gemm is None or call.recipe is not TENSORWISE or not _plain_data(call):  # a row-wise plan's: its recipe's run
        return None
    return run_cpu_gemm(gemm, call.input, call.mat2, call.scale_a, call.scale_b, call.scale_result, call.out_dtype,
                        weights)


def run_cpu_gemm(gemm, input, mat2, scale_a, scale_b, scale_result, out_dtype, weights):
    """The output tensor of the kept plan's compiled call ``gemm`` (:class:`mmaemu.cpu.fused.TensorwiseGemm`) on
    plain CPU tensors of the plan's signature: the codes and the scales' bits to its one compiled call, whose bits
    are those of :func:`_accumulator` then :func:`_epilogue`. ``weights``: where B's prepared panels are kept
    (:mod:`mmaemu.cpu.prepared`), or None."""
    b_codes = _codes_columns(mat2)
    b_rows = None
    if b_codes.size < _PREPARED_MIN_CODES:
        weights = None
    else:  # what finds B's kept panels: the identity and version of mat2.t(), as _accumulator gives that tensor
        b_rows = transposed_weight_ref(mat2)
    scales = numpy.array((_scale_bits(scale_a), _scale_bits(scale_b),
                          0 if scale_result is None else _scale_bits(scale_result), scale_result is not None),
                         numpy.int64)
    bits = gemm.run(_codes_rows(input), b_codes, scales, weights, b_rows)
    return torch.from_numpy(bits).view(out_dtype)


def _epilogue(acc: torch.Tensor, computed_by, plan) -> torch.Tensor:
    """Output tensor of the epilogue (semantics.md (e)) of ``plan``'s call on the accumulator's device.

    An accumulator computed by a CUDA kernel (``computed_by``) gets the CUDA epilogue kernel (same arithmetic,
    validated on the device: its verdict read from the plan's context), so the result never leaves the device;
    otherwise (a CPU engine computed the accumulator, or that kernel is not validated there: warned) the CPU
    epilogue computes and the result is copied to the accumulator's device.
    """
    call = plan.call
    if computed_by is not None:
        from .. import cuda as cuda_backend

        outcome = cuda_backend.epilogue(acc, call.scale_a, call.scale_b, call.scale_result, call.out_dtype,
                                        computed_by, context=plan.context)
        report(outcome.notices)
        if outcome.result is not None:
            return outcome.result
    from ..cpu import epilogue_codes

    out_name = dtype_name(call.out_dtype)
    scale_result = _scale_bits(call.scale_result) if call.scale_result is not None else None
    acc_values = acc.numpy() if acc.device.type == "cpu" else acc.cpu().numpy()
    bits = epilogue_codes(acc_values, _scale_bits(call.scale_a), _scale_bits(call.scale_b), scale_result, out_name)
    result = torch.from_numpy(bits).view(_BITS_DTYPE[out_name]).view(call.out_dtype)
    return result if acc.device.type == "cpu" else result.to(acc.device)


class TensorwiseRecipe(Recipe):
    """One fp32 scale per operand (module docstring)."""

    name = "tensorwise"

    def recognise(self, input, mat2, scale_a, scale_b, profile):
        return True  # last in the registry: the row-wise recogniser has refused every other scale

    def validate(self, input, mat2, found, bias, profile, global_scales, common):
        """f.4 cuBLAS / cuBLASLt-level checks, f.5 the profile's rejections, f.6 mmaemu's scope."""
        M, N, od = common["M"], common["N"], common["out_dtype"]
        input, input_copied = rules._check_layout(input, mat2)  # f.4.2 (may copy input)
        rules._check_modelled_float8(input, mat2)  # f.4.3
        rules._check_cublas_out_dtype(od)  # f.4.4
        rules._check_alignment(input, mat2)  # f.4.5
        rules._check_leading_dimensions(input, mat2)  # f.4.6
        fmt_a = rules._fp8_format(input.dtype)
        fmt_b = rules._fp8_format(mat2.dtype)
        rules._check_profile(profile, fmt_a, fmt_b, od)  # f.5
        rules._check_scope(bias, input=input, mat2=mat2, scale_a=common["scale_a"], scale_b=common["scale_b"],
                           scale_result=common["scale_result"])  # f.6
        return rules.ScaledMMCall(
            input=input, mat2=mat2, fmt_a=fmt_a, fmt_b=fmt_b, zero_size=False,
            layout_std=is_layout_std(input, mat2), input_copied=input_copied,
            **rules._out_flags(common["out"], M, N), **common, recipe=self,
        )

    def pair(self, call) -> str:
        return "tensorwise_tensorwise"

    def plan(self, plan, splitk, backend, context):
        """f.7: maturity, ``out=`` (an unusable out is returned unchanged), the split-K decision, the engine."""
        call = plan.call
        steps.refuse_block_scaled_preset(plan)
        steps.maturity_warnings(plan)
        if call.out_unusable:
            steps.out_warning(plan, steps.OUT_UNCHANGED_MESSAGE)
            plan.action = "out-unchanged"
            return plan
        steps.out_resized_warning(plan)
        M, N, K, fmt_a, fmt_b = rules.split_key(call)
        # the output dtype by name: the split decision reads only its name, which an operand descriptor's dtype has
        steps.decide(plan, M, N, K, fmt_a, fmt_b, dtype_name(call.out_dtype), call.use_fast_accum, splitk,
                     call.layout_std, context)
        steps.choose_backend(plan, call.device, backend, call.fmt_a, call.fmt_b, context)
        return plan

    def run(self, plan, weights=None):
        call = plan.call
        acc, computed_by = _accumulator(plan, call.input, call.mat2.t(), call.fmt_a, call.fmt_b, call.use_fast_accum,
                                        weights)
        return _epilogue(acc, computed_by, plan)


TENSORWISE = TensorwiseRecipe()

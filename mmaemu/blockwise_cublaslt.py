"""torch's block-wise FP8 GEMM through cuBLASLt >= 12.9 on sm_90 (1x128 / 128x128 fp32 scales), bit for bit as
Transformer Engine's zero-tolerance reference of cuBLASLt states it: modelled from a public zero-tolerance
reference, not recorded (profile ``hopper-cublaslt-blockwise-experimental``, :mod:`mmaemu.platform.blockwise`).

The arithmetic of one output (docs/semantics.md, "Block-wise FP8 through cuBLASLt"): each 128-k block is a fresh
fp32 partial ``p``, one wgmma chain from +0 (the ``hopper`` preset: the tensor-wise GEMM of that block with scale
1, slow accumulation); the partials enter an fp32 accumulator from +0 in k order by one fused multiply-add whose
order depends on the scale pair: 1x128 x 1x128 and 1x128 x 128x128 ``y = fma(RN(p * s_a), s_b, y)``, 128x128 x
1x128 ``y = fma(RN(p * s_b), s_a, y)`` (DeepGEMM computes ``fma(RN(s_a * s_b), p, y)`` instead:
:mod:`mmaemu.deepgemm`); a bf16 bias is widened and added in fp32, ``RN(y + bias)``; then one rounding to the
output dtype (bf16 or fp32).

Entry points: :func:`scaled_mm_blockwise` takes the scales as ``F.scaled_mm`` (``torch._scaled_mm_v2``) takes them;
``mmaemu.scaled_mm`` takes ``torch._scaled_mm``'s layout (:mod:`mmaemu.plan.blockwise` states both). Both compute
with :func:`compute_blockwise`, on the chunked engines of :mod:`mmaemu.cpu.chunked` (``backend`` "auto", "cpu",
"reference") or the ``cuda:simple`` kernel of :mod:`mmaemu.cuda.blockwise.kernel`, the same arithmetic.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .base._untraced import untraced
from .context import for_call
from .arith.scaled import OUTPUT_ACCUMULATE_FLAG, OUTPUT_ADD_FLAG, OUTPUT_FP32_FLAG
from .errors import ExperimentalPresetWarning, ReferenceRejectsError, \
    UnsupportedFeatureError
from .cuda.catalog import BLOCKWISE
from .model.chunked import CUBLASLT_BLOCKWISE
from .platform import blockwise as platform_blockwise
from .platform.profiles import get_profile
from .platform.splitk import asks_one_split
from .plan.blockwise import BLOCK_128X128, BLOCK_1X128, block_of, check_blockwise_call, check_v2_scales, pair_name
from .plan.descriptors import dtype_name
from .plan.steps import recipe_engine
from .plan.rules import (_check_bias_dtype, _check_bias_size, _check_divisible_by_16, _check_float8_operands,
                            _check_same_device)
from .warn import Notice, edge, report

__all__ = ["scaled_mm_blockwise", "compute_blockwise", "kernel_for", "BACKENDS"]

BACKENDS = ("auto", "cpu", "reference", "cuda:simple")


def kernel_for(block_a, block_b, out_dtype, has_bias: bool, accumulates: bool = False):
    """The chunked kernel record (:mod:`mmaemu.model.chunked`) of a block-wise call: the pair's combine rule, and
    the output mode of its output dtype (fp32: ``OUTPUT_FP32_FLAG``, else bf16), bias (``OUTPUT_ADD_FLAG``: added
    in fp32 before the cast) and accumulation into an existing output (``OUTPUT_ACCUMULATE_FLAG``: after it)."""
    kernel = CUBLASLT_BLOCKWISE[(tuple(block_a), tuple(block_b))]
    mode = ((OUTPUT_FP32_FLAG if dtype_name(out_dtype) == "float32" else 0) | (OUTPUT_ADD_FLAG if has_bias else 0)
            | (OUTPUT_ACCUMULATE_FLAG if accumulates else 0))
    return dataclasses.replace(kernel, output=mode)


def _scale_rows(scale, block, operand: str, api: str, rows: int, chunks: int) -> np.ndarray:
    """The fp32 scale of each row's chunk [rows, chunks] of one operand from its scale tensor as the entry point
    ``api`` lays it out (:mod:`mmaemu.plan.blockwise`): first the [rows or row blocks, chunks] matrix, then a
    128x128 scale repeated over its 128 rows."""
    values = scale.detach().to(torch.float32).cpu().numpy()
    if block == BLOCK_1X128:
        blocks = values.T if (operand, api) == ("b", "v1") else values
    elif (operand, api) == ("a", "v1"):
        blocks = values
    else:
        blocks = values.T[:, :chunks]  # [L4 or chunks, row blocks] with the K padding dropped
    if block == BLOCK_128X128:
        blocks = np.repeat(blocks, 128, axis=0)[:rows]
    return np.ascontiguousarray(blocks, dtype=np.float32)


def _codes(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().view(torch.uint8).cpu().numpy()


def accumulate_chunked(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel, backend, b_rows=None,
                       weights=None, *, context=None):
    """fp32 accumulators [M, N] of the chunked ``kernel`` (:mod:`mmaemu.model.chunked`) on ``backend`` ("cpu",
    "reference" or "cuda:simple": the block-wise recipe's CUDA kernel, launched through its registry entry,
    :data:`mmaemu.cuda.catalog.REGISTRY`); the one step of both block-wise front doors (``scaled_mm`` and
    :mod:`mmaemu.deepgemm`). ``b_rows``: the tensor of B's rows [N, K] whose codes ``b_codes`` are, or None: on
    "cpu" a repeated B (a weight) then has its decoded panels kept between calls
    (:data:`mmaemu.cpu.prepared.WEIGHTS`, as ``scaled_mm`` keeps them, or ``weights``: a layer's slot,
    :class:`mmaemu.cpu.prepared.WeightSlot`). ``context``: the call's :class:`mmaemu.context.Context` (the CPU
    engine of the chunks :mod:`mmaemu.cpu.chunked` gives to :func:`mmaemu.cpu.engine.accumulate_codes`; None: that
    of the moment)."""
    if backend == "cuda:simple":
        from .cuda.catalog import BLOCKWISE, REGISTRY

        return REGISTRY[BLOCKWISE].launch(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel)
    from .cpu.chunked import accumulate_chunked_codes, kept_panels
    from .cpu.prepared import WEIGHTS

    reference = backend == "reference"
    store = WEIGHTS if weights is None else weights
    prepared = None if reference or b_rows is None else kept_panels(store, b_rows, b_codes, fmt_a, fmt_b, kernel,
                                                                    a_codes.shape[0], context)
    return accumulate_chunked_codes(a_codes, b_codes, fmt_a, fmt_b, scales_a, scales_b, kernel, reference=reference,
                                    prepared_b=prepared, context=context)


def compute_blockwise(mat_a, mat_b, scale_a, scale_b, spec, bias, out_dtype, backend,
                      accumulate_into=None, *, context=None) -> torch.Tensor:
    """The [M, N] result of a checked block-wise call (``spec``: :class:`mmaemu.plan.blockwise.BlockwiseSpec`) on
    ``backend`` ("cpu", "reference" or "cuda:simple"), on mat_a's device; ``accumulate_into``: an [M, N] tensor of
    ``out_dtype`` the result is added to after its cast, or None; ``context``: the call's
    :class:`mmaemu.context.Context` (:func:`accumulate_chunked`)."""
    M, K = mat_a.shape
    N = mat_b.shape[1]
    chunks = -(-K // 128)
    kernel = kernel_for(spec.block_a, spec.block_b, out_dtype, bias is not None, accumulate_into is not None)
    scales_a = _scale_rows(scale_a, spec.block_a, "a", spec.api, M, chunks)
    scales_b = _scale_rows(scale_b, spec.block_b, "b", spec.api, N, chunks)
    b_rows = mat_b.t()
    final = accumulate_chunked(_codes(mat_a), _codes(b_rows), spec.fmt_a, spec.fmt_b, scales_a, scales_b, kernel,
                               backend, b_rows=b_rows, context=context)
    from .cpu.chunked import chunked_output

    addend = None if bias is None else bias.detach().reshape(-1).to(torch.float32).cpu().numpy()
    existing = None if accumulate_into is None else accumulate_into.detach().to(torch.float32).cpu().numpy()
    bits = chunked_output(final, kernel, addend, existing).reshape(M, N)
    if kernel.output & OUTPUT_FP32_FLAG:
        result = torch.from_numpy(bits.view(np.int32)).view(torch.float32)
    else:
        result = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    return result.to(mat_a.device)


# ------------------------------------------------------------------------------------------------------------
# F.scaled_mm's form


def _one_scale(scale, name: str):
    """F.scaled_mm passes each scale as a list (``_expand_single_value``): a block-wise recipe has one tensor."""
    if isinstance(scale, (list, tuple)):
        if len(scale) != 1:
            raise ReferenceRejectsError(f"Invalid scaling configuration: a block-wise recipe takes one {name} "
                                        f"tensor, got {len(scale)} [torch _scaled_mm_v2]")
        scale = scale[0]
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scaled_mm_blockwise: {name} must be a torch.Tensor, got {type(scale).__name__}")
    return scale


@untraced
def scaled_mm_blockwise(mat_a, mat_b, scale_a, scale_b, *, block_a, block_b, out_dtype=torch.bfloat16, bias=None,
                        use_fast_accum=False, profile=None, splitk="auto", backend="auto", accumulate_into=None):
    """``F.scaled_mm`` with block-wise scales (``ScalingType.BlockWise1x128`` / ``BlockWise128x128``) as torch 2.13
    computes it through cuBLASLt >= 12.9 on an H100, bit for bit as the model states it (module docstring).

    ``mat_a`` [M, K] row-major and ``mat_b`` [K, N] column-major, ``float8_e4m3fn``; ``scale_a`` / ``scale_b``: the
    fp32 scales exactly as ``F.scaled_mm`` passes them to ``torch._scaled_mm_v2`` (a tensor or a one-element
    list): 1x128 ``[rows, ceil(K/128)]`` with strides ``(1, rows)``, 128x128 ``[L4, ceil(rows/128)]`` with strides
    ``(1, L4)``, ``L4 = round_up(ceil(K/128), 4)`` (rows = M for A, N for B); ``block_a`` / ``block_b``: (1, 128)
    or (128, 128), or the ``ScalingType`` members; the pair is 1x128 x 1x128, 1x128 x 128x128 or 128x128 x 1x128.
    ``out_dtype``: torch.bfloat16 or torch.float32; ``bias``: bf16 [N] with a bf16 output. ``profile``: a name or
    Profile (default ``$MMAEMU_PROFILE`` or "hopper"); only ``hopper-cublaslt-blockwise-experimental`` computes
    it. ``splitk``: "auto" or 1 (no split-K is assumed). ``backend``: "auto", "cpu", "reference", "cuda:simple".
    ``accumulate_into`` (mmaemu's addition, not an F.scaled_mm argument: cuBLASLt's beta = 1 as Transformer
    Engine's GEMM calls it): an [M, N] tensor of ``out_dtype``; the result is ``cast(RN(cast(y) + c))`` (TE's
    reference: "cublas accumulation first convert to output dtype, then accumulate"), returned as a new tensor.

    Raises what torch 2.13 raises (``ReferenceRejectsError``: the checks of ``_scaled_mm_cuda_v2_out`` and
    ``_scaled_block*`` in their order, cuBLAS's refusal of ``use_fast_accum``), and ``UnsupportedFeatureError``
    where the zero-tolerance evidence does not reach (mmaemu.plan.blockwise). Returns the [M, N] result on
    mat_a's device; warns ``ExperimentalPresetWarning`` once per process per scale pair.
    """
    with edge():
        context = for_call()  # the edge: the profile and the CPU engine read this one reading of the environment
        for name, value in (("mat_a", mat_a), ("mat_b", mat_b)):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"scaled_mm_blockwise: {name} must be a torch.Tensor, got {type(value).__name__}")
        scale_a, scale_b = _one_scale(scale_a, "scale_a"), _one_scale(scale_b, "scale_b")
        block_a, block_b = block_of(block_a, "block_a"), block_of(block_b, "block_b")
        profile = get_profile(profile, context=context)
        if mat_a.dim() != 2 or mat_b.dim() != 2 or mat_a.shape[1] != mat_b.shape[0]:
            raise ReferenceRejectsError(f"mat_a [M, K] and mat_b [K, N] must be matrices that can be multiplied, "
                                        f"got {list(mat_a.shape)} and {list(mat_b.shape)} [torch _scaled_mm_v2]")
        (M, K), N = mat_a.shape, mat_b.shape[1]
        if M == 0 or N == 0 or K == 0:  # torch returns before any other check (+0 for K = 0)
            return torch.zeros((M, N), dtype=out_dtype, device=mat_a.device)
        _check_divisible_by_16(M, K, N)
        _check_float8_operands(mat_a, mat_b)
        _check_bias_dtype(bias, out_dtype)
        _check_bias_size(bias, N)
        _check_same_device(mat_a, mat_b, scale_a, scale_b, bias, None, None)
        check_v2_scales(mat_a, mat_b, scale_a, scale_b, block_a, block_b)
        grad = dict(mat_a=mat_a, mat_b=mat_b, scale_a=scale_a, scale_b=scale_b, bias=bias)
        spec = check_blockwise_call(mat_a, mat_b, block_a, block_b, out_dtype, bias, None, use_fast_accum, profile,
                                    "v2", grad)
        if not asks_one_split(splitk):
            raise UnsupportedFeatureError(f"splitk={splitk!r}: {platform_blockwise.NO_SPLIT_REASON}; use "
                                          "splitk='auto' or 1")
        _check_accumulate_into(accumulate_into, M, N, out_dtype, mat_a.device)
        pair = pair_name(block_a, block_b)
        report([Notice(ExperimentalPresetWarning, platform_blockwise.maturity_message(pair), (f"blockwise:{pair}",))])
        # scaled_mm's rule for the recipe's engine: the switch, the verdict, $MMAEMU_BACKEND (plan.steps)
        engine = recipe_engine(mat_a.device, backend, context, recipe=BLOCKWISE)
        report(engine.notices)
        return compute_blockwise(mat_a, mat_b, scale_a, scale_b, spec, bias, out_dtype, engine.backend,
                                 accumulate_into, context=engine.context)


def _check_accumulate_into(c, M: int, N: int, out_dtype, device) -> None:
    """``accumulate_into`` is None or an [M, N] tensor of the output dtype on mat_a's device."""
    if c is None:
        return
    if not isinstance(c, torch.Tensor) or tuple(c.shape) != (M, N) or c.dtype != out_dtype or c.device != device:
        got = (f"{list(c.shape)} {c.dtype} on {c.device}" if isinstance(c, torch.Tensor) else type(c).__name__)
        raise ValueError(f"accumulate_into must be a [{M}, {N}] {out_dtype} tensor on {device}, got {got}")

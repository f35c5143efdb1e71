"""The block-scaled recipe: MXFP8, MXFP4 and NVFP4 (torch's ``BlockWise1x32`` / ``BlockWise1x16`` on sm_100), as
the B200 profile models cuBLASLt's GEMM (:mod:`mmaemu.platform.block_scaled`, whose :data:`RECIPES
<mmaemu.platform.block_scaled.RECIPES>` is the one table of the three block-scaled variants).

* Recognised: both scales ``float8_e8m0fnu`` or both ``float8_e4m3fn``, of the swizzled size
  (:func:`mmaemu.plan.block_scaled.block_scaling`, B.1); its operands may be packed FP4.
* Rules: :func:`mmaemu.plan.block_scaled.check_block_scaled_call` (B.2-B.4). Plan: experimental (a warning that
  names what is unknown), S = 1, the instruction's preset, the engines of
  :func:`mmaemu.plan.steps.choose_block_scaled_backend`.
* Host preparation: the kernel's operands (:func:`mmaemu.plan.block_scaled.kernel_operands`: codes, FP4 unpacked,
  the swizzled scales mapped back to their blocks, K zero-padded to whole instructions), made once for every
  engine (:func:`_block_scaled_accumulator`). Epilogue: alpha = 1, or NVFP4's product of the global scales
  (:func:`_block_scaled_epilogue`).
"""

from __future__ import annotations

from ..errors import ExperimentalPresetWarning, UnsupportedFeatureError
from ..formats import dtype_name
from ..platform import block_scaled
from ..platform.splitk import SplitDecision, asks_one_split
from ..plan import rules, steps
from ..plan.block_scaled import block_scaling, check_block_scaled_call
from ..warn import Notice
from ._torch import BitsDtypes, torch_for
from .base import Recipe
from .tensorwise import _PREPARED_MIN_CODES, _codes_rows, _scale_bits

torch = torch_for(globals())

__all__ = ["BLOCK_SCALED", "BlockScaledRecipe"]

_BITS_DTYPE = BitsDtypes()


_ONE_F32_BITS = 0x3F800000


def _block_scaled_codes(t: torch.Tensor, fmt: str):
    """One uint8 code per element [rows, K] of a row-major float8 or packed float4_e2m1fn_x2 operand."""
    from .. import formats

    codes = _codes_rows(t)
    return formats.unpack_fp4(codes) if fmt == "e2m1" else codes


def _block_scaled_accumulator(plan, weights=None) -> torch.Tensor:
    """fp32 accumulators [M, N] of an MXFP8 / MXFP4 / NVFP4 call: the kernel's operands (the swizzled scales mapped
    back to their blocks, K zero-padded to whole instructions: :func:`mmaemu.plan.block_scaled.kernel_operands`),
    then one chain of the instruction per output. On the CPU's fast path a repeated mat2 with the same scale_b (a
    weight) is prepared once and kept in ``weights`` (:data:`mmaemu.cpu.prepared.WEIGHTS`, byte-compared on every
    use); ``weights`` None prepares it for this call only."""
    import numpy

    from ..formats import unpack_fp4
    from ..plan.block_scaled import kernel_operands

    call = plan.call
    spec = call.spec
    a_codes, scale_a = _block_scaled_codes(call.input, spec.fmt_a), _codes_rows(call.scale_a.reshape(-1))
    b_raw, scale_b = _codes_rows(call.mat2.t()), _codes_rows(call.scale_b.reshape(-1))

    def b_operands(raw):
        raw = raw.reshape(-1)
        codes = raw[:b_raw.size].reshape(b_raw.shape)
        codes = unpack_fp4(codes) if spec.fmt_b == "e2m1" else codes
        ops = kernel_operands(numpy.zeros((0, codes.shape[1]), numpy.uint8), codes, numpy.zeros(0, numpy.uint8),
                              raw[b_raw.size:], spec)
        return ops.b, ops.scale_b

    if plan.backend == "cuda:simple":  # the recipe's CUDA kernel, launched through its registry entry
        from ..cuda.catalog import BLOCK_SCALED as KERNEL, REGISTRY

        b, sb = b_operands(numpy.concatenate((b_raw.reshape(-1), scale_b)))
        a, _, sa, _ = kernel_operands(a_codes, b[:0, :a_codes.shape[1]], scale_a, numpy.zeros(0, numpy.uint8), spec)
        return REGISTRY[KERNEL].launch(a, b, spec.fmt_a, spec.fmt_b, sa, sb, spec.recipe.scale_fmt, spec.preset,
                                       call.device)
    from ..cpu.block_scaled import accumulate_block_scaled, kept_b_engine

    kept, raw = None, None
    if (weights is not None and plan.backend != "reference" and call.mat2.device.type == "cpu"
            and b_raw.size >= _PREPARED_MIN_CODES):
        engine = kept_b_engine(f"{spec.fmt_b}:{spec.recipe.scale_fmt}:{spec.block}:{spec.K}:{spec.padded_K}",
                               b_operands, spec.fmt_b, spec.recipe.scale_fmt, spec.block)
        kept = _kept_unchanged(weights.candidate(engine, spec.fmt_b, call.mat2), b_raw.reshape(-1), scale_b)
        if kept is None:  # not kept, or changed: the store compares again, drops, prepares (the bytes joined)
            raw = numpy.concatenate((b_raw.reshape(-1), scale_b))
            kept = weights.prepared(engine, spec.fmt_b, call.mat2, raw.reshape(1, -1))
    if kept is None:
        raw = numpy.concatenate((b_raw.reshape(-1), scale_b)) if raw is None else raw
    b, sb = (kept.codes, kept.scales) if kept is not None else b_operands(raw)
    a, _, sa, _ = kernel_operands(a_codes, b[:0, :a_codes.shape[1]], scale_a, numpy.zeros(0, numpy.uint8), spec)
    acc = accumulate_block_scaled(a, b, spec.fmt_a, spec.fmt_b, sa, sb, spec.recipe.scale_fmt, spec.preset,
                                  reference=plan.backend == "reference",
                                  prepared_b=None if kept is None else kept.prepared)
    return torch.from_numpy(acc)


def _kept_unchanged(candidate, b_raw, scale_b):
    """The prepared B of the store's ``candidate`` (:meth:`mmaemu.cpu.prepared.WeightSlot.candidate`) when the bytes
    it was prepared from are B's raw bytes then its scale bytes as this call holds them (compared in place, without
    joining them), else None."""
    from ..cpu.prepared import same_bytes

    if candidate is None or candidate.codes.size != b_raw.size + scale_b.size:
        return None
    codes = candidate.codes
    if same_bytes(codes[:b_raw.size], b_raw) and same_bytes(codes[b_raw.size:], scale_b):
        return candidate.prepared
    return None


def _block_scaled_epilogue(acc: torch.Tensor, call) -> torch.Tensor:
    """cuBLASLt's epilogue of a block-scaled call (:mod:`mmaemu.platform.block_scaled`): alpha = 1, or
    fp32(global_scale_a * global_scale_b) for two-level NVFP4, applied as semantics.md (e) applies scale_a *
    scale_b; on the CPU, the result copied to the call's device."""
    from ..cpu import epilogue_codes

    out_name = dtype_name(call.out_dtype)
    if call.global_scales is None:
        alpha_bits = (_ONE_F32_BITS, _ONE_F32_BITS)
    else:
        alpha_bits = tuple(_scale_bits(g) for g in call.global_scales)
    bits = epilogue_codes(acc.cpu().numpy(), *alpha_bits, None, out_name)
    return torch.from_numpy(bits).view(_BITS_DTYPE[out_name]).view(call.out_dtype).to(call.device)


class BlockScaledRecipe(Recipe):
    """MXFP8 / MXFP4 / NVFP4 block scales (module docstring)."""

    name = "block_scaled"
    fp4_operands = True

    def recognise(self, input, mat2, scale_a, scale_b, profile):
        return block_scaling(scale_a, scale_b, input, mat2)

    def validate(self, input, mat2, found, bias, profile, global_scales, common):
        return _block_scaled_call(input, mat2, found, bias, profile, global_scales, **common)

    def pair(self, call) -> str:
        spec = call.spec
        single = spec.recipe.name == "nvfp4" and getattr(call, "global_scales", None) is None
        return f"{spec.recipe.name}_{spec.recipe.name}" + ("_single_scale" if single else "")

    def plan(self, plan, splitk, backend, context):
        return _plan_block_scaled(plan, splitk, backend, context)

    def run(self, plan, weights=None):
        return _block_scaled_epilogue(_block_scaled_accumulator(plan, weights), plan.call)


def _block_scaled_call(input, mat2, scaling, bias, profile, global_scales, **common) -> rules.ScaledMMCall:
    """An MXFP8 / NVFP4 call after f.3: the rules of :mod:`mmaemu.plan.block_scaled` (B.2-B.4)."""
    grad = dict(input=input, mat2=mat2, scale_a=common["scale_a"], scale_b=common["scale_b"],
                scale_result=common["scale_result"])
    for name, g in zip(("global_scale_a", "global_scale_b"), global_scales or ()):
        grad[name] = g
    spec = check_block_scaled_call(input, mat2, scaling, common["out_dtype"], bias, common["out"], profile,
                                   global_scales, grad)
    resize, resize_warns = rules._out_resize(common["out"], common["M"], common["N"])
    return rules.ScaledMMCall(
        input=input, mat2=mat2, fmt_a=None, fmt_b=None, zero_size=False, layout_std=True, input_copied=False,
        out_column_major=False, out_unusable=False, out_resize=resize, out_resize_warns=resize_warns,
        spec=spec, global_scales=global_scales, **common, recipe=BLOCK_SCALED,
    )


def _plan_block_scaled(plan: steps.Plan, splitk, backend, context) -> steps.Plan:
    """An MXFP8 / MXFP4 / NVFP4 call (:mod:`mmaemu.platform.block_scaled`): experimental; one chain of the
    instruction per output over all of K (zero-padded to whole instructions), so S = 1 only; CPU engines, or
    ``cuda:simple`` when asked for by name."""
    call = plan.call
    spec = call.spec
    plan.preset = spec.preset
    padded = spec.padded_K != spec.K
    steps.note(plan, [Notice(ExperimentalPresetWarning,
                             block_scaled.maturity_message(spec.recipe, spec.preset.name, padded),
                             (f"block-scaled:{plan.profile.name}:{spec.recipe.name}:"
                              f"{'padded' if padded else 'whole'}",))])
    steps.out_resized_warning(plan)
    if not asks_one_split(splitk):
        raise UnsupportedFeatureError(
            f"splitk={splitk!r}: {spec.recipe.name.upper()} calls are modelled with one chain per output "
            f"({block_scaled.NO_SPLIT_REASON}); use splitk='auto' or 1")
    plan.kernel = block_scaled.KERNEL
    plan.split = SplitDecision(1, "none", "kernel", False, None,
                               f"{block_scaled.NO_SPLIT_REASON}; instruction {spec.preset.name}, "
                               f"{spec.recipe.name.upper()} block {spec.block}, K = {spec.K} elements"
                               f"{f', K zero-padded to {spec.padded_K}' if padded else ''}; unknown: "
                               f"{'; '.join(block_scaled.unknowns(spec.recipe, padded))}")
    steps.choose_block_scaled_backend(plan, call.device, backend, context, recipe=BLOCK_SCALED.name)
    return plan


BLOCK_SCALED = BlockScaledRecipe()

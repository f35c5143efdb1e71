"""The block-wise recipe: fp32 scales per 1 x 128 strip or 128 x 128 block of K (torch 2.13's DeepSeek-style
scales), computed as cuBLASLt >= 12.9 does on an H100 (:mod:`mmaemu.platform.blockwise`, the GEMM
:func:`mmaemu.blockwise_cublaslt.compute_blockwise`). The same recipe behind ``F.scaled_mm``
(:func:`mmaemu.blockwise_cublaslt.scaled_mm_blockwise`) and, with DeepGEMM's kernels, :mod:`mmaemu.deepgemm`
(planned by :mod:`mmaemu.plan.deepgemm`); "chunked" names the arithmetic of its kernels (128-k chunks,
:mod:`mmaemu.model.chunked`), not the recipe.

* Recognised: on the block-wise profile only, a pair of torch ``_scaled_mm``'s 1x128 / 128x128 scale layouts
  (:func:`mmaemu.plan.blockwise.v1_blockwise_pair`); on the other profiles the row-wise recogniser refuses them as
  torch 2.7.1 does, naming the profile that computes them.
* Rules: :func:`mmaemu.plan.blockwise.check_blockwise_call`. Plan: experimental (a warning), S = 1 (no split-K
  table recorded), the engines of the block-scaled recipe (:func:`mmaemu.plan.steps.choose_block_scaled_backend`).
* Host preparation, kernels and epilogue: :func:`mmaemu.blockwise_cublaslt.compute_blockwise` (bias included).
"""

from __future__ import annotations

from ..errors import ExperimentalPresetWarning, UnsupportedFeatureError
from ..platform import blockwise
from ..platform.blockwise import is_blockwise_profile
from ..platform.splitk import SplitDecision, asks_one_split
from ..plan import rules, steps
from ..plan.blockwise import check_blockwise_call, pair_name, v1_blockwise_pair
from ..warn import Notice
from .base import Recipe

__all__ = ["BLOCKWISE", "BlockwiseRecipe"]


class BlockwiseRecipe(Recipe):
    """1x128 / 128x128 fp32 block scales through cuBLASLt >= 12.9 (module docstring)."""

    name = "blockwise"
    takes_bias = True

    def recognise(self, input, mat2, scale_a, scale_b, profile):
        if not is_blockwise_profile(profile):
            return None  # torch 2.7.1 refuses them ("Invalid scaling configuration", the row-wise recogniser)
        return v1_blockwise_pair(input, mat2, scale_a, scale_b)

    def validate(self, input, mat2, found, bias, profile, global_scales, common):
        return _blockwise_call(input, mat2, found, bias, profile, **common)

    def pair(self, call) -> str:
        # The route the planner has always looked up for these calls (explain's kernel_family and the patch logs
        # show it); the block pairs of kernel_families.RECIPE_PAIRS are the v2 entry point's.
        return "tensorwise_tensorwise"

    def plan(self, plan, splitk, backend, context):
        return _plan_blockwise(plan, splitk, backend, context)

    def run(self, plan, weights=None):
        from ..blockwise_cublaslt import compute_blockwise

        call = plan.call
        return compute_blockwise(call.input, call.mat2, call.scale_a, call.scale_b, call.spec, call.bias,
                                 call.out_dtype, plan.backend, context=plan.context)


def _blockwise_call(input, mat2, pair, bias, profile, **common) -> rules.ScaledMMCall:
    """A block-wise call after f.3: the rules of :mod:`mmaemu.plan.blockwise` (cuBLASLt >= 12.9's sm_90 kernels)."""
    grad = dict(input=input, mat2=mat2, scale_a=common["scale_a"], scale_b=common["scale_b"], bias=bias)
    spec = check_blockwise_call(input, mat2, *pair, common["out_dtype"], bias, common["out"],
                                common["use_fast_accum"], profile, "v1", grad)
    resize, resize_warns = rules._out_resize(common["out"], common["M"], common["N"])
    return rules.ScaledMMCall(
        input=input, mat2=mat2, fmt_a=spec.fmt_a, fmt_b=spec.fmt_b, zero_size=False, layout_std=True,
        input_copied=False, out_column_major=False, out_unusable=False, out_resize=resize,
        out_resize_warns=resize_warns, bias=bias, spec=spec, **common, recipe=BLOCKWISE,
    )


def _plan_blockwise(plan: steps.Plan, splitk, backend, context) -> steps.Plan:
    """A block-wise call through cuBLASLt >= 12.9 (:mod:`mmaemu.platform.blockwise`): experimental; no split-K
    table is recorded, so S = 1 is assumed; the engines of the block-scaled calls."""
    call = plan.call
    spec = call.spec
    pair = pair_name(spec.block_a, spec.block_b)
    steps.note(plan, [Notice(ExperimentalPresetWarning, blockwise.maturity_message(pair), (f"blockwise:{pair}",))])
    steps.out_resized_warning(plan)
    if not asks_one_split(splitk):
        raise UnsupportedFeatureError(f"splitk={splitk!r}: {blockwise.NO_SPLIT_REASON}; use splitk='auto' or 1")
    plan.kernel = blockwise.KERNEL
    plan.split = SplitDecision(1, "none", "kernel", False, None, blockwise.NO_SPLIT_REASON)
    steps.choose_block_scaled_backend(plan, call.device, backend, context, recipe=BLOCKWISE.name)
    return plan


BLOCKWISE = BlockwiseRecipe()

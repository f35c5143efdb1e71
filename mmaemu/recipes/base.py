"""What a recipe is: the value every scaled_mm call is validated, planned and computed by (:mod:`mmaemu.recipes`).

A recipe is one object of a :class:`Recipe` subclass, in one module, listed once in :data:`mmaemu.recipes.RECIPES`.
The house calls it at four points, and nowhere else decides which recipe a call is:

1. :meth:`Recipe.recognise` (validation, torch's scaling type f.2.4-5): whether the call's scales are this
   recipe's, tried in the registry's order; what it returns (not None) is handed to :meth:`Recipe.validate`.
2. :meth:`Recipe.validate` (after torch's common rules and the zero-size return): the recipe's own rules, in
   torch's order, and the call spec, a :class:`mmaemu.plan.rules.ScaledMMCall` whose ``recipe`` is this recipe.
3. :meth:`Recipe.plan` (:func:`mmaemu.plan.planner.plan_scaled_mm`): warnings, the split decision, the kernel
   the reference runs and the engine that computes it, from the plan's :class:`mmaemu.context.Context`.
4. :meth:`Recipe.run` (:func:`mmaemu.api.run_scaled_mm_plan`): the host preparation of the operands, the
   accumulator on the plan's engine and the epilogue: the result tensor (``out=`` is the caller's business).
"""

from __future__ import annotations

__all__ = ["Recipe"]


class Recipe:
    """One recipe of ``scaled_mm``. A subclass sets the class attributes and implements the five methods.

    * ``name``: the recipe's name in mmaemu (one word: "tensorwise", "rowwise", "blockwise", "block_scaled").
    * ``fp4_operands``: whether its operands may be packed FP4 (torch's f.2.11 then admits float4_e2m1fn_x2 and
      refuses ``use_fast_accum`` with them).
    * ``takes_bias``: whether its call spec keeps the bias (the plan cache then binds each call's bias).
    """

    name: str = ""
    fp4_operands: bool = False
    takes_bias: bool = False

    def recognise(self, input, mat2, scale_a, scale_b, profile):
        """What identifies the call as this recipe's (any value but None), or None; raises what torch raises for
        scales of this kind it refuses. Called after f.2.1-3 (two matrices of matching K)."""
        raise NotImplementedError

    def validate(self, input, mat2, found, bias, profile, global_scales, common: dict):
        """The recipe's rules after f.3 (M, N, K > 0), in torch's order; returns the call spec
        (:class:`mmaemu.plan.rules.ScaledMMCall`, ``recipe=self``). ``found``: :meth:`recognise`'s answer;
        ``common``: the fields every call spec has (M, N, K, out_dtype, the scales, use_fast_accum, out, device)."""
        raise NotImplementedError

    def pair(self, call) -> str:
        """torch's name of the recipe pair of the validated call (:data:`mmaemu.platform.kernel_families.RECIPE_PAIRS`),
        which the profile's kernel route is looked up by."""
        raise NotImplementedError

    def plan(self, plan, splitk, backend, context):
        """Decide the validated call in ``plan`` (:class:`mmaemu.plan.steps.Plan`): its warnings, split, reference
        kernel and engine (:mod:`mmaemu.plan.steps`); returns the plan. Raises what scaled_mm raises for them."""
        raise NotImplementedError

    def run(self, plan, weights=None):
        """The result tensor [M, N] of a planned call that computes (``plan.action == "compute"``), on the call's
        device. ``weights``: where the CPU engine keeps mat2's prepared panels between calls, or None."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<recipe {self.name}>"

"""The recipes of ``scaled_mm``, as values: each one room (a module) that owns what makes it a recipe, and one table.

A recipe (:class:`~mmaemu.recipes.base.Recipe`) recognises its scales, applies its rules into a call spec, plans
the call from the plan's context, prepares its operands once for every engine, and computes the accumulator and the
epilogue. Validation (:func:`mmaemu.plan.validate.validate_scaled_mm`) finds the recipe once, from the scales, and
the call carries it: the planner calls ``call.recipe.plan(...)`` and the API ``plan.recipe.run(plan)``; nothing
else asks which recipe a call is. docs/architecture.md, "Recipes", shows how a recipe is added.

* :mod:`.tensorwise`: one fp32 scale per operand (cuBLASLt 12.8);
* :mod:`.rowwise`: per-row and per-column fp32 scales and a bias (torch 2.7.1's CUTLASS kernel);
* :mod:`.blockwise`: 1x128 / 128x128 fp32 block scales (cuBLASLt >= 12.9);
* :mod:`.block_scaled`: MXFP8 / MXFP4 / NVFP4 (the B200's block-scaled instructions).
"""

from __future__ import annotations

from .base import Recipe
from .block_scaled import BLOCK_SCALED
from .blockwise import BLOCKWISE
from .rowwise import ROWWISE
from .tensorwise import TENSORWISE

__all__ = ["Recipe", "RECIPES", "recipe_named", "recipe_pair_of"]

#: The registry, in torch's order of recognising scales (its get_scaling_type): block scales first (B.1), the
#: block-wise pairs (on the block-wise profile), row-wise, and tensor-wise last (what no recipe before it took).
RECIPES = (BLOCK_SCALED, BLOCKWISE, ROWWISE, TENSORWISE)


def recipe_named(name: str) -> Recipe:
    """The recipe of that :attr:`~mmaemu.recipes.base.Recipe.name` (KeyError naming the known ones)."""
    for recipe in RECIPES:
        if recipe.name == name:
            return recipe
    raise KeyError(f"unknown recipe {name!r}; known: {', '.join(r.name for r in RECIPES)}")


def recipe_pair_of(call) -> str:
    """torch's name of the recipe pair of a validated scaled_mm call (:data:`kernel_families.RECIPE_PAIRS
    <mmaemu.platform.kernel_families.RECIPE_PAIRS>`): its recipe's; a zero-size call, which no recipe computes,
    has the tensor-wise pair."""
    recipe = getattr(call, "recipe", None)
    return (TENSORWISE if recipe is None else recipe).pair(call)

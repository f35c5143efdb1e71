"""docs/architecture.md's example of a recipe is the code: the smallest recipe module, its lines as they are (in
their order; ``...`` stands for lines left out), and the registry as :mod:`mmaemu.recipes` writes it."""

from __future__ import annotations

import inspect
import pathlib
import re

import mmaemu.recipes as recipes

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
EXAMPLE_LEAD = "The smallest recipe module, block-wise\n(`recipes/blockwise.py`)"


def _python_blocks_after(lead: str):
    """The ```python blocks of the doc after ``lead``, in order."""
    return re.findall(r"```python\n(.*?)```", DOC[DOC.index(lead):], re.S)


def _module_lines(module) -> list:
    return pathlib.Path(inspect.getfile(module)).read_text(encoding="utf-8").splitlines()


def test_the_example_is_the_smallest_recipe_module():
    sizes = {recipe.name: len(_module_lines(inspect.getmodule(type(recipe)))) for recipe in recipes.RECIPES}
    assert min(sizes, key=sizes.get) == "blockwise", sizes


def test_every_line_of_the_example_is_in_the_module_in_its_order():
    from mmaemu.recipes import blockwise

    code = _module_lines(blockwise)
    example, _ = _python_blocks_after(EXAMPLE_LEAD)[:2]
    position = 0
    for line in example.splitlines():
        if not line.strip() or line.strip() == "...":
            continue
        assert line in code[position:], f"not in recipes/blockwise.py (after line {position}): {line!r}"
        position = code.index(line, position) + 1


def test_the_registry_line_is_the_registry():
    _, registry = _python_blocks_after(EXAMPLE_LEAD)[:2]
    assert registry.strip() in _module_lines(recipes)
    assert registry.strip() == "RECIPES = (" + ", ".join(r.name.upper() for r in recipes.RECIPES) + ")"

"""Planning a call: validation, which finds the call's recipe, then the recipe's plan (maturity warnings, ``out=``
handling, the split-K decision and the backend: semantics.md f.7, platform.md sections 2-4 and 6.1;
:mod:`mmaemu.recipes`, made of the steps of :mod:`mmaemu.plan.steps`). Nothing is computed here.

Each decision returns its warnings as data (:class:`mmaemu.warn.Notice`); the planner keeps them in the plan
(``CallPlan.warnings`` has the text of every warning that applies) and reports them as it goes
(:func:`mmaemu.warn.report`), so that a call refused later in the plan still gives the warnings found before.
The entry point decides what happens to them: ``scaled_mm``/``accumulate`` emit them (once per process per key,
at the user's line); ``explain`` plans inside :func:`mmaemu.warn.collecting`, so it emits nothing and consumes no
once-per-process slot. The entry point also gives the plan its :class:`mmaemu.context.Context` (``context=``),
which every decision of the plan reads (required: the planner never reads the environment itself).
"""

from __future__ import annotations

from ..model.presets import get_preset
from ..platform import get_profile, kernel_families
from ..recipes import recipe_pair_of
from ..warn import collecting
from .block_scaled import split_two_level
from .steps import (OUT_RESIZED_MESSAGE, OUT_UNCHANGED_MESSAGE, CallPlan, Plan, check_backend_name, choose_backend,
                    decide, maturity_warnings, refuse_block_scaled_preset)
from .validate import validate_accumulate, validate_scaled_mm

__all__ = ["CallPlan", "Plan", "plan_scaled_mm", "plan_accumulate", "explain_scaled_mm", "recipe_pair_of",
           "OUT_UNCHANGED_MESSAGE", "OUT_RESIZED_MESSAGE"]


def plan_scaled_mm(input, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                   use_fast_accum=False, *, out=None, profile=None, splitk="auto", backend="auto",
                   global_scales=None, context) -> Plan:
    """Validate and plan a ``scaled_mm`` call in the order of semantics.md (f); raises what scaled_mm raises.
    ``global_scales``: NVFP4's (global_scale_a, global_scale_b) or None (:mod:`mmaemu.plan.block_scaled`); they
    may also come as ``(block scales, global scale)`` pairs in scale_a and scale_b.

    The operands may also be :class:`~mmaemu.plan.descriptors.TensorDescriptor` (all of them, on a descriptor
    device, with a TorchName out_dtype): the call is then planned without importing torch, and only explained."""
    profile = get_profile(profile, context=context)
    if global_scales is None:
        scale_a, scale_b, global_scales = split_two_level(scale_a, scale_b)
    call = validate_scaled_mm(input, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, out,
                              profile=profile, global_scales=global_scales)
    plan = Plan(call, profile, get_preset(profile.preset, warn=False), context=context,
                route=kernel_families.route("scaled_mm", recipe_pair_of(call), profile))
    if call.zero_size:
        plan.action = "zeros"
        return plan
    check_backend_name(backend, context)
    return call.recipe.plan(plan, splitk, backend, context)


def plan_accumulate(a, b, *, use_fast_accum, profile=None, splitk="auto", backend="auto",
                    out_dtype_for_split=None, context) -> Plan:
    """Validate and plan an ``accumulate`` call (semantics.md f.8)."""
    import torch

    profile = get_profile(profile, context=context)
    call = validate_accumulate(a, b, use_fast_accum=use_fast_accum)
    plan = Plan(call, profile, get_preset(profile.preset, warn=False), context=context)
    if call.zero_size:
        plan.action = "zeros"
        return plan
    check_backend_name(backend, context)
    refuse_block_scaled_preset(plan)
    maturity_warnings(plan)
    out_dtype = torch.float32 if out_dtype_for_split is None else out_dtype_for_split
    decide(plan, call.M, call.N, call.K, call.fmt_a, call.fmt_b, out_dtype, call.use_fast_accum, splitk, True,
           context)
    choose_backend(plan, call.device, backend, call.fmt_a, call.fmt_b, context)
    return plan


def explain_scaled_mm(*args, **kwargs) -> CallPlan:
    """The CallPlan of a scaled_mm call; never raises for a bad call (its ``validation`` says what would). The
    call is planned inside :func:`mmaemu.warn.collecting`: nothing is emitted, no once-per-process slot is used."""
    with collecting():
        try:
            return plan_scaled_mm(*args, **kwargs).describe()
        except Exception as error:  # explain reports every failure of the call instead of raising it
            return _failed_plan(error, kwargs.get("profile"), kwargs["context"])


def _failed_plan(error: Exception, profile, context) -> CallPlan:
    name = preset = maturity = None
    try:
        resolved = get_profile(profile, context=context)
        name, preset_obj = resolved.name, get_preset(resolved.preset, warn=False)
        preset, maturity = preset_obj.name, preset_obj.maturity
    except Exception:  # an unknown profile is itself the error being reported
        pass
    message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return CallPlan((type(error).__name__, message), name, preset, maturity, None, "", [], [])

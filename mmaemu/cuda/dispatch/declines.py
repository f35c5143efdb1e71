"""Why a CUDA kernel does not compute a call by design: its decline rules, read from its registry entry
(:mod:`mmaemu.cuda.catalog`: ``declines`` for a schedule and preset, ``device_declines`` for a device).

A decline is never a failure and never warned: the choice (:func:`mmaemu.cuda.dispatch.gating.choose`) passes the
kernel over and lists why, and a self-test skips the cases its kernel declines. Importing this module imports
neither numba nor torch; a rule's module is imported when the rule is first asked.
"""

from __future__ import annotations

from ...arith.params import Schedule
from ..catalog import GEMM, REGISTRY

# A schedule that only the preset and formats shape: one split, fast accumulation (see design_skip).
UNSPLIT_FAST = Schedule(1, 1, 0, 0, 0, 0)


def _is_gemm(kernel: str) -> bool:
    return kernel in REGISTRY and REGISTRY[kernel].kind == GEMM and REGISTRY[kernel].declines is not None


def design_skip(kernel: str, preset, fmt_a: str, fmt_b: str):
    """Why ``kernel`` cannot compute this preset by design (None if it can): its decline rule
    (:func:`mmaemu.cuda.dispatch.launch.kernel_decline`) judged on an unsplit fast schedule, i.e. what the preset
    and formats alone rule out. Never a failure, never warned."""
    if _is_gemm(kernel):
        from ...arith.params import preset_params

        why = REGISTRY[kernel].declines(UNSPLIT_FAST, preset_params(preset, fmt_a, fmt_b))
        if why is not None:
            return f"{why} (preset {preset.name!r})"
    return None


def device_skip(kernel: str, info, preset=None):
    """Why ``kernel`` cannot run on the device of ``info`` (its :class:`mmaemu.base.device_facts.DeviceFacts`; for
    ``preset``, when given) by design (None if it can): the kernel's decline rule for devices (its entry's
    ``device_declines``; ``cuda:native``: :func:`mmaemu.cuda.native.devices.device_decline`), None for a kernel
    without one."""
    entry = REGISTRY.get(kernel)
    rule = None if entry is None else entry.device_declines
    return None if rule is None else rule(info, preset)


def schedule_skip(kernel: str, preset, fmt_a: str, fmt_b: str, use_fast_accum, splits=1, scheme="none"):
    """Why ``kernel`` cannot compute this call's schedule by design (None if it can): design_skip, plus what the
    schedule rules out (the offset kernel: k-tiles that start on its stages). Never a failure, never warned."""
    skip = design_skip(kernel, preset, fmt_a, fmt_b)
    if skip is not None or not _is_gemm(kernel):
        return skip
    from ...arith.params import preset_params, schedule_params

    return REGISTRY[kernel].declines(schedule_params(preset, 1, use_fast_accum, splits, scheme),
                                     preset_params(preset, fmt_a, fmt_b))

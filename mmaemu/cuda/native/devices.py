"""Which devices ``cuda:native`` runs on: its decline rule for a device (the design rule for a schedule and preset
is :func:`mmaemu.cuda.native.kernel.native_decline`, beside the kernel).

``cuda:native`` issues the FP8 MMA instruction its device runs natively
(:data:`mmaemu.cuda.catalog.NATIVE_INSTRUCTIONS`: sm_90's warpgroup MMA, which only numba-cuda compiles, its target
being sm_90a; sm_89's mma.sync) and computes that instruction's preset only. FP8 ``mma.sync`` on sm_90/sm_100 is
not a native FP8 instruction (ptxas rewrites it), so it never stands in for the warpgroup MMA. This module imports
neither numba nor torch: the status of the kernels reads it without loading any kernel.
"""

from __future__ import annotations

from ..catalog import NATIVE_INSTRUCTIONS


def _block(preset):
    return preset.nfma, preset.frac, preset.frac_out, preset.min_exp, preset.late_c


def device_decline(info, preset=None):
    """Why ``cuda:native`` cannot run on the device of ``info`` (its :class:`mmaemu.base.device_facts.DeviceFacts`), for
    ``preset`` when given; None if it can. A decline by design: never a failure, never warned."""
    sm = f"sm_{info.capability[0]}{info.capability[1]}"
    entry = NATIVE_INSTRUCTIONS.get(tuple(info.capability))
    if entry is None:
        known = ", ".join(f"{target} ({name}, {preset_name} preset)"
                          for name, preset_name, target in NATIVE_INSTRUCTIONS.values())
        return f"issues the native FP8 MMA of {known} only, this device is {sm}"
    instruction, preset_name, target = entry
    if target[-1].isalpha() and "numba-cuda" not in info.compiler:  # see mmaemu.cuda.device.compiler_description
        return f"needs numba-cuda to target {target} (pip install 'mmaemu[cuda]'); {info.compiler} cannot"
    if preset is not None:
        from ...model.presets import get_preset

        if _block(preset) != _block(get_preset(preset_name, warn=False)):
            return (f"computes the {preset_name} preset's block on {sm} ({instruction}), preset {preset.name!r} has "
                    "another")
    return None

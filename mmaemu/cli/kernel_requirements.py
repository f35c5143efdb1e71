"""Whether a CUDA kernel must pass its self-test on a device (platform.md section 7), from the kernel metadata.

Required: not gated and the device meets ``min_cc``, or gated and the device's capability is in ``validated_on``.
Otherwise optional: a rejection only stops auto-selection. No click here: this is library logic that
``mmaemu selftest`` needs and the library does not offer yet.
"""

from __future__ import annotations

import importlib
from typing import Optional, Tuple

from ..base import device_facts

_METADATA_MODULES = ("..backends", "..cuda")


def cc_tuple(value) -> Optional[tuple]:
    """(major, minor) of a capability written as (8, 9), "8.9", 8.9, 89, "89" or "sm_89"; None if unreadable."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return int(value[0]), int(value[1])
    text = str(value).strip().lower().replace("sm_", "").replace("sm", "")
    if "." in text:
        major, _, minor = text.partition(".")
        return int(major), int(minor)
    if text.isdigit():
        return divmod(int(text), 10)
    return None


def _kernel_spec(name: str):
    """The metadata of kernel ``name`` in ``mmaemu.backends.KERNELS`` or ``mmaemu.cuda.KERNELS`` (name -> object
    or dict with ``gated``, ``validated_on``, ``min_cc``), or None."""
    for module in _METADATA_MODULES:
        try:
            kernels = getattr(importlib.import_module(module, __package__), "KERNELS", None)
        except Exception:  # no such module: no metadata there
            continue
        if isinstance(kernels, dict):
            spec = kernels.get(name) or kernels.get(name.split(":", 1)[-1])
            if spec is not None:
                return spec
    return None


def kernel_requirement(name: str, device_index: int) -> Tuple[bool, str]:
    """(required, why) of kernel ``name`` on CUDA device ``device_index``; without metadata every kernel is
    required."""
    cc = device_facts.read(device_index).capability
    cc_text = f"sm_{cc[0]}{cc[1]}"
    spec = _kernel_spec(name)
    if spec is None:
        return True, "required: no kernel metadata, every kernel counts"

    def attr(key, default=None):
        return spec.get(key, default) if isinstance(spec, dict) else getattr(spec, key, default)

    if attr("gated", False):
        validated = [cc_tuple(v) for v in (attr("validated_on", ()) or ())]
        listed = ", ".join(f"sm_{v[0]}{v[1]}" for v in validated if v) or "none"
        if cc in validated:
            return True, f"required: gated, validated on {cc_text}"
        return False, f"optional: gated, {cc_text} is not among validated_on ({listed})"
    min_cc = cc_tuple(attr("min_cc"))
    if min_cc is None or cc >= min_cc:
        return True, "required: not gated" + (f", {cc_text} meets min_cc {min_cc[0]}.{min_cc[1]}" if min_cc else "")
    return False, f"optional: {cc_text} is below min_cc {min_cc[0]}.{min_cc[1]}"

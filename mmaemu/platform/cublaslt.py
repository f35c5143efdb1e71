"""cuBLASLt on the reference GPU itself: device matching (platform.md 3.6) for the live heuristic query (3.5).

The query itself goes through NVIDIA's bindings (:mod:`.heuristic`, the optional extra ``mmaemu[record]``). The
facts a profile is matched by (the driver's device name and SM count, the loaded cuBLASLt version) are read by
:mod:`mmaemu.base.device_facts`, on ctypes (see there why). None of it runs at import time or when
MMAEMU_DISABLE_CUDA=1, and any probe error means "not the reference GPU" (False / no answer), so a machine without
CUDA simply skips the live query.
"""

from __future__ import annotations

import sys
from typing import Optional, Tuple

from ..context import Context
from ..base.device_facts import (
    CublasLtError,
    driver_device_info,
    load_cublaslt,
    loaded_cublaslt_version,
    mapped_cublaslt_paths,
)

__all__ = [
    "CublasLtError",
    "profile_matches_device",
    "load_cublaslt",
    "loaded_cublaslt_version",
    "mapped_cublaslt_paths",
    "version_matches",
]


# ----------------------------------------------------------------------------------------------------------------
# Device matching (platform.md 3.6)


def profile_matches_device(profile, device=None, *, context: Context) -> bool:
    """True only if ``device`` is the profile's reference GPU: same driver device name, same SM count and the
    same loaded cuBLASLt version (major.minor.patch, and build when both sides know it). Never the compute
    capability alone; any probe error → False; nothing is touched when MMAEMU_DISABLE_CUDA is true (in the
    environment of ``context``, a :class:`mmaemu.context.Context`: :meth:`mmaemu.platform.definitions.Profile.
    matches_device`, the public entry point, gives its call's)."""
    if not (profile.gpu_name and profile.sm_count and profile.cublaslt_version):
        return False
    if context.environment["MMAEMU_DISABLE_CUDA"]:
        return False
    try:
        ordinal = cuda_ordinal(device)
        if ordinal is None:
            return False
        name, sm_count = driver_device_info(ordinal)
        if name != profile.gpu_name or sm_count != profile.sm_count:
            return False
        return version_matches(profile.cublaslt_version, loaded_cublaslt_version())
    except Exception:  # a probe: any error means "not this GPU"
        return False


def cuda_ordinal(device=None) -> Optional[int]:
    """CUDA ordinal of ``device``; None for a non-CUDA device. Default: torch's current CUDA device if torch has
    already initialised CUDA (torch is never imported here), else ordinal 0."""
    if device is None or (isinstance(device, str) and device == "cuda"):
        return _current_ordinal()
    if isinstance(device, int) and not isinstance(device, bool):
        return device if device >= 0 else None
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "cuda":
            return None
        return int(index) if index else _current_ordinal()
    kind, index = getattr(device, "type", None), getattr(device, "index", None)
    if kind != "cuda":
        return None
    return int(index) if index is not None else _current_ordinal()


def _current_ordinal() -> int:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    return 0


def version_matches(expected: str, loaded: Tuple[int, ...]) -> bool:
    """major.minor.patch equal, and the 4th (build) component equal when both sides have one."""
    want = tuple(int(x) for x in expected.split("."))
    if tuple(loaded[:3]) != want[:3]:
        return False
    return len(want) < 4 or len(loaded) < 4 or want[3] == loaded[3]

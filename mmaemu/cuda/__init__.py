"""The CUDA backend (Numba CUDA kernels over :mod:`mmaemu.arith`). Not yet available."""

from ..backends import Selection
from ..errors import BackendUnavailableError


def select(device, name, fmt_a, fmt_b, preset):
    reason = "cuda: no CUDA kernels are built into this version"
    if name == "auto":
        return Selection("cpu", [reason])
    raise BackendUnavailableError(f"backend {name!r} cannot run: {reason}; use backend='cpu'")

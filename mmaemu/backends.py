"""Backend selection: which engine computes a call (platform.md section 4, our own engines).

Every engine returns the bits of the reference path; they differ only in speed and device:

* ``reference`` - the straightforward CPU loop over the arithmetic (one chain walk per output), the oracle
  of every other engine;
* ``cpu`` - the fast parallel CPU path (same arithmetic, tiled);
* ``cuda`` / ``cuda:<kernel>`` - Numba CUDA kernels over the same arithmetic (:mod:`mmaemu.cuda`), used on a
  device only after they pass its self-test.

``backend="auto"`` is replaced by ``$MMAEMU_BACKEND`` when set; then CUDA tensors get the first CUDA kernel
that passed its self-test, everything else the ``cpu`` engine. CUDA tensors in give CUDA tensors out, always.
"""

from __future__ import annotations

import dataclasses
import os
from typing import List

from .errors import BackendUnavailableError

CPU_ENGINES = ("reference", "cpu")
TRUTHY = ("1", "true", "yes", "on")


@dataclasses.dataclass(frozen=True)
class Selection:
    """The engine chosen for a call, and why the faster ones before it were not used."""

    name: str
    fallbacks: List[str]


def requested_backend(backend) -> str:
    """The backend name asked for: ``backend``, with "auto" replaced by ``$MMAEMU_BACKEND`` when set."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string such as 'auto', 'cpu' or 'cuda', got {type(backend).__name__}")
    if backend == "auto":
        backend = os.environ.get("MMAEMU_BACKEND") or "auto"
    if backend not in ("auto", "cuda") + CPU_ENGINES and not backend.startswith("cuda:"):
        raise ValueError(
            f"unknown backend {backend!r}; expected 'auto', 'reference', 'cpu', 'cuda' or 'cuda:<kernel>'"
        )
    return backend


def cuda_disabled() -> bool:
    """``MMAEMU_DISABLE_CUDA`` is truthy: never touch CUDA."""
    return os.environ.get("MMAEMU_DISABLE_CUDA", "").strip().lower() in TRUTHY


def select(device, backend, fmt_a, fmt_b, preset) -> Selection:
    """Choose the engine for tensors on ``device`` (platform.md 4.4, with our engines)."""
    name = requested_backend(backend)
    if name in CPU_ENGINES:
        return Selection(name, [])
    on_cuda = getattr(device, "type", str(device)) == "cuda"
    if not on_cuda or cuda_disabled():
        reason = "cuda: tensors on cpu" if not on_cuda else "cuda: disabled by MMAEMU_DISABLE_CUDA"
        if name == "auto":
            return Selection("cpu", [reason])
        raise BackendUnavailableError(f"backend {name!r} cannot run: {reason}; use backend='cpu' or 'auto'")
    from . import cuda as cuda_backend

    return cuda_backend.select(device, name, fmt_a, fmt_b, preset)

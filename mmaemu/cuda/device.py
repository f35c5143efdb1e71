"""Which CUDA device a call runs on, whether the kernels can run there, and the identity its verdicts are keyed by.

A probe never raises for an unusable device: it raises :class:`DeviceUnavailable` with the reason, which the
dispatcher reports ("cuda: <reason>"). Probing a device initialises CUDA (through torch and numba) and is only done
when CUDA tensors are seen or a status/self-test is asked for. Whether CUDA is disabled (``MMAEMU_DISABLE_CUDA``) is
the caller's to say (``disabled=``, from the context of its decision): this module reads no environment.
"""

from __future__ import annotations

import functools
from typing import Optional

from ..base import device_facts


class DeviceUnavailable(Exception):
    """The CUDA kernels cannot run on this device; the message says why."""


# Why no kernel runs when the caller's context disables CUDA (the text of every report of it).
DISABLED_REASON = "disabled by MMAEMU_DISABLE_CUDA"


# The facts of a device, the kernels' view included (its ``compiler``): one type for every layer.
DeviceFacts = device_facts.DeviceFacts


@functools.lru_cache(maxsize=None)
def compiler_description() -> str:
    """The numba CUDA implementation in use, with versions (no driver call; a process fact, read once)."""
    import numba

    from . import shim

    implementation = shim.cuda_implementation()
    if implementation == "numba-cuda":
        try:
            from importlib.metadata import version

            return f"numba {numba.__version__} + numba-cuda {version('numba-cuda')}"
        except Exception:  # pragma: no cover - metadata missing
            return f"numba {numba.__version__} + numba-cuda"
    return f"numba {numba.__version__} ({implementation} CUDA target)"


def _index_of(device) -> Optional[int]:
    import torch

    if device is None:
        return None
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise DeviceUnavailable(f"tensors on {device.type}")
    return device.index


def probe(device=None, *, disabled: bool = False) -> DeviceFacts:
    """The facts of ``device`` (None: torch's current CUDA device) as the kernels see it (a
    :class:`mmaemu.base.device_facts.DeviceFacts` with its ``compiler``); DeviceUnavailable with the reason if the
    kernels cannot run there. ``disabled``: the caller's context disables CUDA (``MMAEMU_DISABLE_CUDA``, e.g.
    :attr:`mmaemu.context.Context.cuda_disabled`): DeviceUnavailable before anything is probed. The facts are read
    once per device and process (:func:`mmaemu.base.device_facts.read`, the one cache of them), whether numba's CUDA
    driver answers once per process (:func:`_numba_cuda_problem`)."""
    from . import shim

    if disabled:
        raise DeviceUnavailable(DISABLED_REASON)
    if shim.simulator_enabled():
        raise DeviceUnavailable("numba's CUDA simulator is enabled (NUMBA_ENABLE_CUDASIM=1): the kernels run only on "
                                "simulator arrays, never on torch CUDA tensors")
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        raise DeviceUnavailable(f"torch cannot be imported: {exc}") from None
    index = _index_of(device)
    if not torch.cuda.is_available():
        raise DeviceUnavailable("no CUDA device visible to torch")
    if index is None:
        index = torch.cuda.current_device()
    return _probe_index(index)


def _probe_index(index: int) -> DeviceFacts:
    import torch

    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise DeviceUnavailable(f"no CUDA device {index} ({count} visible to torch)")
    facts = device_facts.read(index)
    problem = _numba_cuda_problem()
    if problem is not None:
        raise DeviceUnavailable(problem)
    return facts._replace(compiler=compiler_description())


@functools.lru_cache(maxsize=None)
def _numba_cuda_problem() -> Optional[str]:
    """Why numba's CUDA target cannot run kernels in this process (None: it can); a process fact, asked once."""
    try:
        from numba import cuda
    except Exception as exc:
        return (f"numba.cuda cannot be imported ({type(exc).__name__}: {exc}); "
                "install numba-cuda (pip install 'mmaemu[cuda]')")
    try:
        available = cuda.is_available()
    except Exception as exc:
        available, why = False, f"{type(exc).__name__}: {exc}"
    else:
        why = ""
    if available:
        return None
    if not why:
        try:
            why = str(cuda.cuda_error() or "")
        except Exception:
            why = ""
    why = " ".join(why.split())[:300]
    return f"numba.cuda finds no usable CUDA driver{': ' + why if why else ''}"


def reset():
    """Forget probed devices (tests)."""
    _numba_cuda_problem.cache_clear()
    device_facts.forget()

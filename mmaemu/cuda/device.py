"""Which CUDA device a call runs on, whether the kernels can run there, and the identity its verdicts are keyed by.

A probe never raises for an unusable device: it raises :class:`DeviceUnavailable` with the reason, which the
dispatcher reports ("cuda: <reason>"). Probing a device initialises CUDA (through torch and numba) and is only done
when CUDA tensors are seen or a status/self-test is asked for. Whether CUDA is disabled (``MMAEMU_DISABLE_CUDA``) is
the caller's to say (``disabled=``, from the context of its decision): this module reads no environment.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from .. import device_facts


class DeviceUnavailable(Exception):
    """The CUDA kernels cannot run on this device; the message says why."""


# Why no kernel runs when the caller's context disables CUDA (the text of every report of it).
DISABLED_REASON = "disabled by MMAEMU_DISABLE_CUDA"


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """A CUDA device as the kernels see it."""

    index: int
    name: str
    uuid: Optional[str]
    capability: Tuple[int, int]
    sm_count: Optional[int]
    driver: str  # CUDA driver API version and, if NVML answers, the display driver version
    compiler: str  # the numba CUDA implementation and versions
    torch_version: str

    def identity(self) -> dict:
        """What a self-test verdict on this device depends on (besides the kernel sources)."""
        return {
            "name": self.name,
            "uuid": self.uuid,
            "capability": list(self.capability),
            "driver": self.driver,
            "compiler": self.compiler,
            "torch": self.torch_version,
        }

    @property
    def label(self) -> str:
        return f"cuda:{self.index} ({self.name}, sm_{self.capability[0]}{self.capability[1]})"


def compiler_description() -> str:
    """The numba CUDA implementation in use, with versions (no driver call)."""
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


_PROBES = {}


def probe(device=None, *, disabled: bool = False) -> DeviceInfo:
    """The DeviceInfo of ``device`` (None: torch's current CUDA device); DeviceUnavailable with the reason if the
    kernels cannot run there. ``disabled``: the caller's context disables CUDA (``MMAEMU_DISABLE_CUDA``, e.g.
    :attr:`mmaemu.context.Context.cuda_disabled`): DeviceUnavailable before anything is probed. Results are cached
    per device index."""
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
    if index in _PROBES:
        cached = _PROBES[index]
        if isinstance(cached, DeviceUnavailable):
            raise cached
        return cached
    try:
        info = _probe_index(index)
    except DeviceUnavailable as exc:
        _PROBES[index] = exc
        raise
    _PROBES[index] = info
    return info


def _probe_index(index: int) -> DeviceInfo:
    import torch

    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise DeviceUnavailable(f"no CUDA device {index} ({count} visible to torch)")
    facts = device_facts.read(index)
    try:
        from numba import cuda
    except Exception as exc:
        raise DeviceUnavailable(f"numba.cuda cannot be imported ({type(exc).__name__}: {exc}); "
                                "install numba-cuda (pip install 'mmaemu[cuda]')") from None
    try:
        available = cuda.is_available()
    except Exception as exc:
        available, why = False, f"{type(exc).__name__}: {exc}"
    else:
        why = ""
    if not available:
        if not why:
            try:
                why = str(cuda.cuda_error() or "")
            except Exception:
                why = ""
        why = " ".join(why.split())[:300]
        raise DeviceUnavailable(f"numba.cuda finds no usable CUDA driver{': ' + why if why else ''}")
    api, display = facts.cuda_driver_api or "unknown", facts.display_driver
    driver_text = f"CUDA driver API {api}" + (f", display driver {display}" if display else "")
    return DeviceInfo(
        index=index,
        name=facts.name,
        uuid=facts.uuid,
        capability=facts.capability,
        sm_count=facts.sm_count,
        driver=driver_text,
        compiler=compiler_description(),
        torch_version=facts.torch_version,
    )


def reset():
    """Forget probed devices (tests)."""
    _PROBES.clear()
    device_facts.forget()

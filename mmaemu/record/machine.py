"""The recording machine: its platform facts and the four things the recorder asks of it.

:class:`Machine` bundles what :func:`mmaemu.record.record` needs from a GPU (so the tests hand in a fake one):
the platform facts of the provenance, NVIDIA's cuBLASLt bindings with a device scale pointer, the descriptor
probe, the real GEMM of the replays and Transformer Engine's workspace. :func:`cuda_machine` is the real one.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Optional, Tuple

from ..base import device_facts
from .. import environment
from ..errors import BackendUnavailableError
from ..platform.heuristic import LtApi

__all__ = ["Machine", "cuda_machine", "default_preset", "te_workspace", "profile_name", "RecordError",
           "RecordUsageError", "RecordUnavailableError", "DEFAULT_PRESETS"]

# The preset a GPU's tensor cores compute, by compute capability (evidence: docs/validation.md).
DEFAULT_PRESETS = {(9, 0): "hopper", (8, 9): "ada"}
_MiB = 1 << 20


class RecordError(RuntimeError):
    """A recording that cannot be made faithfully (no GPU, no bindings, a descriptor the recorder does not
    reproduce, no preset for the GPU); the message says what to do."""


class RecordUsageError(RecordError, ValueError):
    """An argument that cannot describe a recording (name, preset, budget, shapes); raised before anything runs
    (``mmaemu record`` exits 2 for it)."""


class RecordUnavailableError(RecordError, BackendUnavailableError):
    """Nothing can be recorded on this machine: no CUDA GPU visible to torch, or NVIDIA's cuBLASLt bindings are
    missing (``mmaemu record`` exits 4 for it, as for any BackendUnavailableError)."""


@dataclasses.dataclass
class Machine:
    """``platform``: gpu, sm_count, capability [major, minor], driver, cublaslt, torch (provenance and profile);
    ``probe()`` -> (ProbeCalls, TracedMatmuls, the cuBLASLt log text); ``gpu_gemm``: see
    :func:`mmaemu.record.replay.run_replays`;
    ``te_workspace``: (bytes, where the value comes from)."""

    platform: dict
    api: LtApi
    scale_pointer: int
    probe: Callable[[], Tuple[list, list, str]]
    gpu_gemm: Optional[Callable]
    te_workspace: Tuple[int, str]
    device: str = "cuda"


def default_preset(capability) -> Optional[str]:
    return DEFAULT_PRESETS.get(tuple(capability))


def te_workspace(capability) -> Tuple[int, str]:
    """Transformer Engine's cuBLASLt workspace: its own ``get_cublas_workspace_size_bytes()`` when TE is
    installed, else TE 2.x's rule (32 MiB from sm_90 on, 4 MiB below; the shipped profiles' TE workspaces)."""
    try:
        import transformer_engine
        from transformer_engine.pytorch.module.base import get_cublas_workspace_size_bytes

        return int(get_cublas_workspace_size_bytes()), (f"transformer_engine {transformer_engine.__version__}: "
                                                         "get_cublas_workspace_size_bytes()")
    except Exception:
        rule = 32 * _MiB if tuple(capability) >= (9, 0) else 4 * _MiB
        return rule, "Transformer Engine 2.x rule (32 MiB from sm_90 on, 4 MiB below); TE is not installed here"


def profile_name(gpu_name: str, cublaslt: str) -> str:
    """"NVIDIA H200", "12.9.1.4" -> "h200-lt12.9.1.4" (the profile); the table id is "rec_h200-lt12.9.1.4"."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower().replace("nvidia", "").replace("geforce", "")).strip("-")
    return f"{slug or 'gpu'}-lt{cublaslt}"


def cuda_machine(device=None) -> Machine:
    """The CUDA device ``device`` (default: torch's current one) with torch's cuBLASLt."""
    import torch

    from ..platform import heuristic
    from . import probe, replay

    if not torch.cuda.is_available() or environment.snapshot()["MMAEMU_DISABLE_CUDA"]:
        raise RecordUnavailableError("mmaemu record needs a CUDA GPU visible to torch (none is, or "
                                     "MMAEMU_DISABLE_CUDA=1)")
    dev = torch.device("cuda", torch.cuda.current_device() if device is None else int(device))
    torch.cuda.set_device(dev)
    torch.zeros(1, device=dev) @ torch.zeros(1, device=dev)  # loads torch's cuBLAS(Lt) into the process
    name, sm_count = device_facts.driver_device_info(dev.index)  # the facts a profile is matched by
    facts = device_facts.read(dev.index)
    capability = list(facts.capability)
    api = _bindings()
    platform = {"gpu": name, "sm_count": sm_count, "capability": capability, "driver": facts.display_driver,
                "cublaslt": ".".join(str(x) for x in device_facts.loaded_cublaslt_version()),
                "torch": facts.torch_version, "cuda_runtime": facts.torch_cuda,
                "cublaslt_path": (device_facts.mapped_cublaslt_paths() or [None])[0], "bindings": api.source}
    return Machine(platform, api, heuristic.device_scale_pointer(),
                   lambda: probe.run_probe(dev.index), replay.torch_gemm(dev), te_workspace(capability),
                   str(dev))


def _bindings() -> LtApi:
    """NVIDIA's cuBLASLt bindings (torch is imported first); RecordUnavailableError when they are missing."""
    from ..platform import cublaslt, heuristic

    try:
        return heuristic.nvmath_api()
    except cublaslt.CublasLtError as exc:
        raise RecordUnavailableError(str(exc)) from exc


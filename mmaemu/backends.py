"""Backend selection: which engine computes a call (platform.md section 4, our own engines).

Every engine returns the bits of the reference path; they differ only in speed and device:

* ``reference`` - the straightforward CPU loop over the arithmetic (one chain walk per output), the oracle
  of every other engine;
* ``cpu`` - the fast parallel CPU path (same arithmetic, tiled);
* ``cuda`` / ``cuda:<kernel>`` - Numba CUDA kernels over the same arithmetic (:mod:`mmaemu.cuda`), used on a
  device only after they pass its self-test.

``backend="auto"`` is replaced by ``$MMAEMU_BACKEND`` when set; then CUDA tensors get the first CUDA kernel
that passed its self-test, everything else the ``cpu`` engine. CUDA tensors in give CUDA tensors out, always.

CUDA kernels (:data:`KERNELS`, tried by descending priority): ``cuda:biased`` (the formulation of
:mod:`mmaemu.arith.biased`, each product one fp32 fused multiply-add rounding toward zero) and ``cuda:lanes`` (that
of :mod:`mmaemu.arith.tile`), both for unsplit GEMMs of early-accumulator presets - a call they decline by design
goes to the next kernel, without a warning - ``cuda:tiled`` (operands staged through shared memory) and
``cuda:simple`` (one thread per output), plus the ``cuda:epilogue`` kernel that keeps scaled_mm's
epilogue on the device. A kernel that fails its self-test on a device is skipped with one
:class:`~mmaemu.errors.BackendFallbackWarning` (once per device and message per process) and the next one, finally
the ``cpu`` engine, computes; an explicitly requested CUDA backend that cannot run raises
:class:`~mmaemu.errors.BackendUnavailableError` with the reasons. ``MMAEMU_DISABLE_CUDA`` (1/true/yes/on) keeps
every call off CUDA. Importing this module initialises nothing: CUDA is probed only for CUDA tensors,
:func:`backends_status` and :func:`selftest`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Optional, Tuple

from .errors import BackendUnavailableError

CPU_ENGINES = ("reference", "cpu")
TRUTHY = ("1", "true", "yes", "on")


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    """A CUDA kernel of :mod:`mmaemu.cuda` (metadata only; nothing is compiled here)."""

    name: str
    kind: str  # "gemm" (computes accumulators) or "epilogue"
    priority: int  # GEMM kernels are tried from the highest priority down
    summary: str
    gated: bool = False  # every kernel here is exact by construction: none needs a hardware-property gate
    validated_on: Tuple[Tuple[int, int], ...] = ()
    min_cc: Optional[Tuple[int, int]] = None  # whatever the installed CUDA toolkit compiles for

    @property
    def backend(self) -> str:
        return f"cuda:{self.name}"


KERNELS: Dict[str, KernelInfo] = {
    k.name: k
    for k in (
        KernelInfo("biased", "gemm", 40, "32x64 outputs per thread block, a 4x4 register tile per thread; operands "
                   "decoded once into sign-split fp32 panels, staged 32 k at a time; the formulation of "
                   "mmaemu.arith.biased (each product one fp32 fused multiply-add rounding toward zero into a biased "
                   "accumulator); unsplit GEMMs of hopper/ada-like presets only (others go to the next kernel)"),
        KernelInfo("lanes", "gemm", 30, "32x32 outputs per thread block, a 2x4 register tile per thread; FP8 codes "
                   "decoded into shared memory (fp32 values, int8 exponents) 128 k at a time; the formulation of "
                   "mmaemu.arith.tile (exact fp32 products converted to int32 block sums); unsplit GEMMs of "
                   "hopper/ada-like presets only (others go to the next kernel)"),
        KernelInfo("tiled", "gemm", 20, "16x16 outputs per thread block; decoded rows of A and B staged through shared "
                   "memory 128 k at a time; each output walks its schedule with the chain functions of mmaemu.arith"),
        KernelInfo("simple", "gemm", 10, "one thread per output calls mmaemu.arith.schedule.accumulate_one on its rows "
                   "in global memory"),
        KernelInfo("epilogue", "epilogue", 0, "scaled_mm's epilogue (mmaemu.arith.epilogue.epilogue_one) on the "
                   "device, so CUDA results never leave it"),
    )
}


def gemm_kernels() -> List[KernelInfo]:
    """The GEMM kernels in the order "auto"/"cuda" try them."""
    return sorted((k for k in KERNELS.values() if k.kind == "gemm"), key=lambda k: -k.priority)


@dataclasses.dataclass(frozen=True)
class GateResult:
    """One self-test of a kernel on a device. ``ran`` is False when it could not run (no usable device)."""

    name: str
    passed: bool
    reason: str
    details: object
    seconds: float
    cached: bool
    ran: bool = True


@dataclasses.dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can compute on a device, and why (see :func:`backends_status`)."""

    name: str
    available: bool
    source: Optional[str]
    validated_here: bool
    gates: List[GateResult]
    reason: str


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


def kernel_names(kernels) -> List[str]:
    """Kernel names (without "cuda:") from "all", a comma string or an iterable; ValueError for unknown names."""
    if kernels == "all" or kernels is None:
        return list(KERNELS)
    if isinstance(kernels, str):
        kernels = [k for k in kernels.split(",")]
    names = []
    for k in kernels:
        name = str(k).strip()
        name = name[5:] if name.startswith("cuda:") else name
        if name not in KERNELS:
            raise ValueError(f"unknown CUDA kernel {k!r}; expected 'all' or names among {sorted(KERNELS)}")
        if name not in names:
            names.append(name)
    return names


_CPU_STATUS = {
    "cpu": "available: the parallel CPU engine (Numba), every preset and format pair",
    "reference": "available: the straightforward CPU loop over the arithmetic, oracle of every engine",
}


def backends_status(device=None) -> Dict[str, BackendStatus]:
    """{name: BackendStatus} of every CUDA kernel on ``device`` (None: torch's current CUDA device), then "cpu" and
    "reference". Reads cached self-test verdicts; runs none (see :func:`selftest`)."""
    result: Dict[str, BackendStatus] = {}
    if cuda_disabled():
        for k in KERNELS.values():
            result[k.backend] = BackendStatus(k.backend, False, None, False, [], "disabled by MMAEMU_DISABLE_CUDA")
    else:
        from . import cuda as cuda_backend

        result.update(cuda_backend.status(device))
    for name in ("cpu", "reference"):
        result[name] = BackendStatus(name, True, "numba (CPU)", True, [], _CPU_STATUS[name])
    return result


def selftest(device=None, *, kernels="all", force=False) -> Dict[str, List[GateResult]]:
    """Run the self-test of every (or the named) CUDA kernel on ``device`` (None: torch's current CUDA device).

    Returns {"cuda:<kernel>": [GateResult]}; cached verdicts are reused unless ``force``. Without a usable CUDA
    device every result has ``ran=False`` and says why (see :func:`selftest_verdict`).
    """
    names = kernel_names(kernels)
    if cuda_disabled():
        reason = "not run: disabled by MMAEMU_DISABLE_CUDA"
        return {f"cuda:{n}": [GateResult("selftest", False, reason, {}, 0.0, False, ran=False)] for n in names}
    from . import cuda as cuda_backend

    return cuda_backend.run_selftests(device, names, force=force)


def selftest_verdict(results: Dict[str, List[GateResult]]) -> Tuple[str, str]:
    """("PASS" | "FAIL" | "UNAVAILABLE", reason) of :func:`selftest` results (exit codes 0 / 1 / 4 of the CLI)."""
    gates = [(name, g) for name, gs in results.items() for g in gs]
    ran = [(name, g) for name, g in gates if g.ran]
    if not ran:
        why = gates[0][1].reason if gates else "no kernel requested"
        why = why[len("not run: "):] if why.startswith("not run: ") else why
        return "UNAVAILABLE", f"{why}: the cpu backend (CPU) is used"
    failed = [name for name, g in ran if not g.passed]
    if failed:
        return "FAIL", "failed: " + ", ".join(dict.fromkeys(failed))
    skipped = [name for name, g in gates if not g.ran]
    return "PASS", "every kernel passed" + (f" (not run: {', '.join(skipped)})" if skipped else "")

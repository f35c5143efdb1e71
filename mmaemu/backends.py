"""Backend selection: which engine computes a call (platform.md section 4, our own engines).

Every engine returns the bits of the reference path; they differ only in speed and device:

* ``reference`` - the straightforward CPU loop over the arithmetic (one chain walk per output), the oracle
  of every other engine;
* ``cpu`` - the fast parallel CPU path (same arithmetic, tiled);
* ``cuda`` / ``cuda:<kernel>`` - Numba CUDA kernels over the same arithmetic (:mod:`mmaemu.cuda`), used on a
  device only after they pass its self-test.

``backend="auto"`` is replaced by ``$MMAEMU_BACKEND`` when set; then CUDA tensors get the first CUDA kernel
that passed its self-test, everything else the ``cpu`` engine. CUDA tensors in give CUDA tensors out, always.

CUDA kernels (:data:`KERNELS`, tried by descending priority): ``cuda:native`` (the GPU's own FP8 tensor-core
instruction: sm_90's warpgroup MMA for the hopper preset, sm_89's mma.sync for ada; gated by an instruction-level
probe, :mod:`mmaemu.cuda.verdicts.probe`), ``cuda:offset`` (the formulation of :mod:`mmaemu.arith.offset`: one fused
multiply-add rounding toward zero per product and an exact count of the products it floors too far; every schedule
of early-accumulator presets - a call either declines by design goes to the next kernel, without a warning) and
``cuda:simple`` (one thread per output calls ``accumulate_one``: the GPU reference, every preset), plus the
``cuda:epilogue`` kernel that keeps scaled_mm's epilogue on the device. A kernel that fails its self-test on a
device is skipped with one :class:`~mmaemu.errors.BackendFallbackWarning` (once per device and message per
process) and the next one, finally the ``cpu`` engine, computes; an explicitly requested CUDA backend that cannot
run raises :class:`~mmaemu.errors.BackendUnavailableError` with the reasons. ``MMAEMU_DISABLE_CUDA``
(1/true/yes/on) keeps every call off CUDA. Importing this module initialises nothing: CUDA is probed only for CUDA
tensors, :func:`backends_status` and :func:`selftest`.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from .context import context_of
from .cuda.catalog import KERNELS, BackendStatus, GateResult, KernelInfo, Selection, gemm_kernels
from .errors import BackendUnavailableError
from .warn import report

__all__ = ["KERNELS", "BackendStatus", "GateResult", "KernelInfo", "Selection", "gemm_kernels", "select",
           "requested_backend", "cuda_disabled", "backends_status", "selftest", "selftest_verdict"]

CPU_ENGINES = ("reference", "cpu")
BACKEND_ENV = "MMAEMU_BACKEND"
DISABLE_ENV = "MMAEMU_DISABLE_CUDA"


def requested_backend(backend, *, context=None) -> str:
    """The backend name asked for: ``backend``, with "auto" replaced by ``$MMAEMU_BACKEND`` when set (an unknown
    name from there is a ValueError that names the variable); the variable of ``context`` (a
    :class:`mmaemu.context.Context`: the planners and the edge pass theirs). A public entry point: without a
    context (a caller outside the edge), the context of this moment, taken here, and only for "auto"."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string such as 'auto', 'cpu' or 'cuda', got {type(backend).__name__}")
    source = ""
    if backend == "auto":
        env = context_of(context).environment
        if env[BACKEND_ENV]:
            backend, source = env[BACKEND_ENV], f" (from {BACKEND_ENV})"
    if backend not in ("auto", "cuda") + CPU_ENGINES and not backend.startswith("cuda:"):
        raise ValueError(
            f"unknown backend {backend!r}{source}; expected 'auto', 'reference', 'cpu', 'cuda' or 'cuda:<kernel>'"
        )
    return backend


def cuda_disabled(*, context=None) -> bool:
    """``MMAEMU_DISABLE_CUDA`` is true (1/true/yes/on, :func:`mmaemu.environment.parse_bool`): never touch CUDA
    (:attr:`mmaemu.context.Context.cuda_disabled` of ``context``: the planners and the edge pass theirs). A public
    entry point: without a context (a caller outside the edge), the context of this moment, taken here."""
    return context_of(context).cuda_disabled


def select(device, backend, fmt_a, fmt_b, preset, *, context=None) -> Selection:
    """Choose the engine for tensors on ``device`` (platform.md 4.4, with our engines), from the variables of
    ``context`` (a :class:`mmaemu.context.Context`; without one, read now, once). On CUDA tensors the CUDA
    dispatcher probes the device and reads the kernels' verdicts from the context's source
    (:func:`mmaemu.cuda.select`, :func:`mmaemu.cuda.verdicts_of`); the choice's warnings (a kernel that failed its
    self-test, no usable device) are reported (:func:`mmaemu.warn.report`)."""
    context = context_of(context)
    name = requested_backend(backend, context=context)
    if name in CPU_ENGINES:
        return Selection(name, [])
    on_cuda = getattr(device, "type", str(device)) == "cuda"
    if not on_cuda or context.cuda_disabled:
        reason = "cuda: tensors on cpu" if not on_cuda else "cuda: disabled by MMAEMU_DISABLE_CUDA"
        if name == "auto":
            return Selection("cpu", [reason])
        raise BackendUnavailableError(f"backend {name!r} cannot run: {reason}; use backend='cpu' or 'auto'")
    from . import cuda as cuda_backend

    selection = cuda_backend.select(device, name, fmt_a, fmt_b, preset, context=context)
    report(selection.notices)  # the choice's warnings (mmaemu.warn: at the edge, or now when called directly)
    return selection


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


def cpu_engine_summary(*, context) -> str:
    """Which engine the cpu backend runs on this CPU and why (``MMAEMU_CPU_ENGINE`` and the AVX2 self-test source
    of ``context``, the one :func:`backends_status` took; :mod:`mmaemu.cpu.features`,
    :func:`mmaemu.cpu.engine.selftest_of`)."""
    from .cpu.features import CPU_ENGINE_ENV, engine_summary, numba_target
    from .cpu.engine import selftest_of

    return engine_summary(context.environment[CPU_ENGINE_ENV], numba_target(), selftest_of(context))


def backends_status(device=None, *, context=None) -> Dict[str, BackendStatus]:
    """{name: BackendStatus} of every CUDA kernel on ``device`` (None: torch's current CUDA device), then "cpu" and
    "reference", for the variables and verdict source of ``context`` (without one, read now, once). Reads known
    self-test verdicts; runs none (see :func:`selftest`)."""
    context = context_of(context)
    result: Dict[str, BackendStatus] = {}
    if context.cuda_disabled:
        for k in KERNELS.values():
            result[k.backend] = BackendStatus(k.backend, False, None, False, [], "disabled by MMAEMU_DISABLE_CUDA")
    else:
        from . import cuda as cuda_backend

        result.update(cuda_backend.status(device, context=context))
    for name in ("cpu", "reference"):
        reason = _CPU_STATUS[name] + (f"; {cpu_engine_summary(context=context)}" if name == "cpu" else "")
        result[name] = BackendStatus(name, True, "numba (CPU)", True, [], reason)
    return result


def selftest(device=None, *, kernels="all", force=False, context=None) -> Dict[str, List[GateResult]]:
    """Run the self-test of every (or the named) CUDA kernel on ``device`` (None: torch's current CUDA device).

    Returns {"cuda:<kernel>": [GateResult]}; cached verdicts are reused unless ``force``. Without a usable CUDA
    device every result has ``ran=False`` and says why (see :func:`selftest_verdict`). The variables and the
    verdict source are those of ``context`` (without one, read now, once).
    """
    names = kernel_names(kernels)
    context = context_of(context)
    if context.cuda_disabled:
        reason = "not run: disabled by MMAEMU_DISABLE_CUDA"
        return {f"cuda:{n}": [GateResult("selftest", False, reason, {}, 0.0, False, ran=False)] for n in names}
    from . import cuda as cuda_backend

    return cuda_backend.run_selftests(device, names, force=force, context=context)


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

"""The choice of a CUDA kernel for a call and the hand-over of the call to the kernel that computes it
(platform.md section 4, our own kernels).

One rule chooses a kernel (:func:`choose`: the first candidate that does not decline and whose verdict passes),
over the candidates the kernel registry gives a recipe's call (:func:`mmaemu.cuda.catalog.candidates`), for the
selection of a backend, for a call the selected kernel declines and for the epilogues; each kernel's decline rules
are its own (its registry entry, read by :mod:`.declines`). Decisions return their warnings as data
(:class:`mmaemu.warn.Notice`): the caller reports them.

The verdicts come from the verdict store (:mod:`mmaemu.cuda.verdicts.store`: the self-tests a kernel must pass on a
device, cached in memory and on disk). Importing this module imports neither numba.cuda nor torch: that happens
when CUDA tensors are seen (:func:`select`), or a status or self-test is asked for.

Every decision here reads its surroundings from the :class:`mmaemu.context.Context` it is given (``context``,
required: the entry points build it): whether CUDA is disabled (``context.cuda_disabled``), the device's facts
(``context.device``, when it describes the device asked for; else the probe's, read once per device and process),
the kernels forced to fail (``context.forced_failures``) and the source of the verdicts
(:func:`mmaemu.cuda.verdicts.store.verdicts_of`). This module reads no environment itself.
"""

from __future__ import annotations

import threading
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

from ...context import Context, VerdictSource
from ...errors import BackendFallbackWarning, BackendUnavailableError
from ...warn import Notice
from ..catalog import (EPILOGUE, KERNELS, REGISTRY, ROWWISE, TENSORWISE, BackendStatus, GateResult, KernelInfo,
                       Selection, candidates, gemm_kernels)
from ..device import DISABLED_REASON, DeviceUnavailable
from ..verdicts.store import known_verdict, verdicts_of
from .declines import _is_gemm, design_skip, device_skip, schedule_skip

_lock = threading.RLock()
_SELECTIONS: Dict[tuple, Selection] = {}  # key -> Selection (with its warnings), of the process's verdicts only


def _fallback_notice(device_label: str, message: str) -> Notice:
    """A BackendFallbackWarning, once per (device, message) per process."""
    return Notice(BackendFallbackWarning, message, (device_label, message))


def _probe(device):
    """The kernels' view of ``device`` (:func:`mmaemu.cuda.device.probe`; the one step tests replace)."""
    from .. import device as device_module

    return device_module.probe(device)


def _device_info(device, context: Context):
    """The facts of ``device`` for a decision of ``context``: DeviceUnavailable ("disabled by
    MMAEMU_DISABLE_CUDA") when the context disables CUDA, before anything is probed (as
    :func:`mmaemu.cuda.device.probe` with ``disabled=True``); the context's own facts (``context.device``) when they
    are the kernels' view of that device; else the probe's answer."""
    if context.cuda_disabled:
        raise DeviceUnavailable(DISABLED_REASON)
    carried = context.device
    if carried is not None and carried.compiler is not None and _index_of(device) in (None, carried.index):
        return carried
    return _probe(device)


def _index_of(device) -> Optional[int]:
    """The CUDA device index ``device`` names (an int, a torch device or its text), None for the current one."""
    if device is None or isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if index is not None or not isinstance(device, str):
        return index
    _, _, number = device.partition(":")
    return int(number) if number.isdigit() else None


def device_context(device, context: Context) -> Context:
    """``context`` carrying the facts of CUDA device ``device`` as the kernels see it (``context.device``; read once
    per device and process), or the reason there are none (``device_problem``): what a plan of CUDA tensors keeps,
    so that every decision of its call reads the same facts."""
    import dataclasses

    try:
        facts = _device_info(device, context)
    except DeviceUnavailable as exc:
        return dataclasses.replace(context, device=None, device_problem=str(exc))
    return dataclasses.replace(context, device=facts, device_problem=None)


def run_selftests(device, names: List[str], *, force: bool = False, context: Context) -> Dict[str, List[GateResult]]:
    """{"cuda:<name>": [GateResult]} for the named kernels on ``device`` (see :func:`mmaemu.backends.selftest`),
    from the verdict source of ``context`` (:func:`verdicts_of`)."""
    try:
        info = _device_info(device, context)
    except DeviceUnavailable as exc:
        return {f"cuda:{n}": [GateResult("selftest", False, f"not run: {exc}", {}, 0.0, False, ran=False)]
                for n in names}
    verdict = verdicts_of(context, force=force)
    return {f"cuda:{n}": [verdict(info, n)] for n in names}


def status(device=None, *, context: Context) -> Dict[str, BackendStatus]:
    """{"cuda:<name>": BackendStatus} of every kernel with a self-test of its own (:data:`KERNELS`) on ``device``,
    from known verdicts (none is run; :func:`mmaemu.cuda.verdicts.store.known_verdict`), for a decision of
    ``context``."""
    try:
        info = _device_info(device, context)
    except DeviceUnavailable as exc:
        return {k.backend: BackendStatus(k.backend, False, None, False, [], f"unavailable: {exc}")
                for k in KERNELS.values()}
    result = {}
    for k in KERNELS.values():
        why = device_skip(k.name, info)
        if why is not None:
            result[k.backend] = BackendStatus(k.backend, False, info.compiler, False, [], f"unavailable: {why}")
            continue
        verdict = known_verdict(info, k.name, context)
        gates = [verdict] if verdict is not None else []
        if verdict is None and k.gated:
            available, reason = True, (f"not validated yet on {info.label}: its instruction probe and self-test "
                                       "run on first use (or run mmaemu.selftest())")
        elif verdict is None:
            available, reason = True, f"not validated yet on {info.label}: its self-test runs on first use " \
                                      "(or run mmaemu.selftest())"
        elif verdict.passed:
            available, reason = True, f"validated on {info.label}"
        else:
            available, reason = False, f"self-test failed on {info.label}: {verdict.reason}"
        result[k.backend] = BackendStatus(k.backend, available, info.compiler, bool(verdict and verdict.passed),
                                          gates, reason)
    return result


# ----------------------------------------------------------------------------------------------------------------
# Selection and computation


class Choice(NamedTuple):
    """The kernel chosen for a call: ``kernel`` (None: none can, the cpu engine computes), ``passed_over``
    ("cuda:<kernel>: why" of each kernel tried before it, in order: its decline or its failed verdict) and
    ``notices`` (the warning of the failed verdicts, when announced; to be reported by the caller)."""

    kernel: Optional[KernelInfo]
    passed_over: Tuple[str, ...]
    notices: Tuple[Notice, ...]


def choose(candidates: Iterable[KernelInfo], decline: Callable[[KernelInfo], Optional[str]],
           verdict: Callable[[KernelInfo], GateResult], *, device_label: Optional[str] = None) -> Choice:
    """The first of ``candidates`` (in order) that does not decline and whose verdict passes: the one rule that
    chooses a CUDA kernel, for the selection of a backend (:func:`select`) and for a call its selected kernel
    declines (:func:`accumulate`).

    ``decline(kernel)``: why the kernel does not compute the call by design (None if it does): listed, never
    warned. ``verdict(kernel)``: its self-test verdict on the device, asked only of a kernel that does not decline
    (a verdict may run the self-test). Failed verdicts are listed too and, when ``device_label`` is given, make one
    :class:`~mmaemu.errors.BackendFallbackWarning` (once per device and text per process) that names them and who
    computes instead. Nothing is emitted here.
    """
    passed_over: List[str] = []
    failures: List[str] = []
    chosen = None
    for kernel in candidates:
        why = decline(kernel)
        if why is not None:
            passed_over.append(f"{kernel.backend}: {why}")
            continue
        result = verdict(kernel)
        if result.passed:
            chosen = kernel
            break
        failures.append(f"{kernel.backend}: {result.reason}")
        passed_over.append(failures[-1])
    notices = ()
    if failures and device_label is not None:
        name = chosen.backend if chosen is not None else "cpu"
        notices = (_fallback_notice(device_label, f"mmaemu on {device_label}: " + "; ".join(failures)
                                    + f"; {name} computes instead"
                                    + (" (result copied back to the device)" if chosen is None else "")),)
    return Choice(chosen, tuple(passed_over), notices)


class DefaultChoice(NamedTuple):
    """What ``backend="auto"`` picks for CUDA tensors on a device before any call (``mmaemu info``): ``kernel``, the
    kernel the first call takes if its verdict passes (None: no kernel can run there; ``unavailable`` says why when
    the device itself cannot be used), ``validated`` (its verdict is known and passed) and ``contenders``, the
    kernels that may compute at the first call, by priority: ``kernel``, then each kernel the rule would take next
    if those before it failed their self-tests."""

    kernel: Optional[KernelInfo]
    validated: bool
    contenders: Tuple[KernelInfo, ...]
    unavailable: Optional[str]


# The stand-in of a verdict not known yet when auto's default is told (default_choice): the first call runs it.
_NOT_RUN_YET = GateResult("selftest", True, "not validated yet: its self-test runs on first use", {}, 0.0, False,
                          ran=False)


def default_choice(device=None, *, context: Context) -> DefaultChoice:
    """What ``backend="auto"`` picks for CUDA tensors on ``device`` (None: torch's current CUDA device) by the
    rule of :func:`select`: :func:`choose` over the GEMM kernels by priority, with each kernel's decline rule for
    the device (:func:`device_skip`; the preset is each call's, so design declines are not judged) and the verdicts
    known without running anything (:func:`mmaemu.cuda.verdicts.store.known_verdict`, as :func:`status` reads
    them; a kernel without one yet counts as passing: its self-test runs at the first call). ``context``: the
    decision's; its forced failures are not applied, as :func:`status` does not apply them. Runs no self-test."""
    try:
        info = _device_info(device, context)
    except DeviceUnavailable as exc:
        return DefaultChoice(None, False, (), str(exc))
    known: Dict[str, Optional[GateResult]] = {}

    def verdict(kernel: KernelInfo) -> GateResult:
        if kernel.name not in known:
            known[kernel.name] = known_verdict(info, kernel.name, context)
        return known[kernel.name] or _NOT_RUN_YET

    contenders: List[KernelInfo] = []
    remaining = gemm_kernels()
    while True:  # the first kernel, then the one the rule takes if it failed, and so on
        kernel = choose(remaining, lambda k: device_skip(k.name, info), verdict).kernel
        if kernel is None:
            break
        contenders.append(kernel)
        remaining = remaining[remaining.index(kernel) + 1:]
    first = contenders[0] if contenders else None
    return DefaultChoice(first, first is not None and known[first.name] is not None, tuple(contenders), None)


def select(device, name, fmt_a, fmt_b, preset, *, context: Context) -> Selection:
    """The engine for CUDA tensors on ``device`` (platform.md 4.4 with our kernels), with its warnings as data
    (``Selection.notices``: the caller reports them), from the verdicts of ``context`` (:func:`verdicts_of`); the
    process's source runs self-tests on first use.

    A selection from the process's verdicts is kept per device, formats, preset, name and forced failures, and
    gives its warnings again when reused; a context with its own verdict source neither reads nor fills that
    store (its verdicts are not the process's)."""
    explicit = name[len("cuda:"):] if name.startswith("cuda:") else None
    if explicit is not None and not _is_gemm(explicit):
        known = ", ".join(f"'cuda:{k.name}'" for k in gemm_kernels())
        raise BackendUnavailableError(f"backend {name!r} cannot run: no such CUDA GEMM kernel (known: {known})")
    try:
        info = _device_info(device, context)
    except DeviceUnavailable as exc:
        reason = f"cuda: {exc}"
        if name == "auto":
            return Selection("cpu", [reason], (_fallback_notice(
                str(device), f"mmaemu: {reason}; the cpu backend computes and the result is copied back to the "
                "device"),))
        raise BackendUnavailableError(f"backend {name!r} cannot run: {reason}; use backend='cpu' or 'auto'") from None
    kept = context.verdicts is None  # only a selection from the process's verdicts is kept
    cache_key = (info.index, fmt_a, fmt_b, preset, name, context.forced_failures)
    selection = None
    if kept:
        with _lock:
            selection = _SELECTIONS.get(cache_key)
    if selection is None:
        selection = _select_kernel(info, explicit, name, fmt_a, fmt_b, preset, verdicts_of(context))
        if kept:
            with _lock:
                _SELECTIONS[cache_key] = selection
    # A cached selection gives its warnings again: the caller's report emits them only if no call has yet.
    return Selection(selection.name, list(selection.fallbacks), selection.notices)


def _select_kernel(info, explicit: Optional[str], name: str, fmt_a, fmt_b, preset, verdict: VerdictSource):
    """The Selection of :func:`select` on the device of ``info`` (``explicit``: the kernel named, None: every GEMM
    kernel by priority), by :func:`choose` with the verdicts of ``verdict``; BackendUnavailableError when a named
    backend cannot run."""
    candidates = [KERNELS[explicit]] if explicit is not None else gemm_kernels()
    choice = choose(candidates,
                    lambda k: design_skip(k.name, preset, fmt_a, fmt_b) or device_skip(k.name, info, preset),
                    lambda k: verdict(info, k.name), device_label=info.label)
    if choice.kernel is None and name != "auto":
        raise BackendUnavailableError(f"backend {name!r} cannot run on {info.label}: "
                                      + "; ".join(choice.passed_over))
    return Selection(choice.kernel.backend if choice.kernel is not None else "cpu", list(choice.passed_over),
                     choice.notices)


class Accumulators(NamedTuple):
    """fp32 accumulators [M, N] on the tensors' CUDA device and the GEMM kernel that computed them ("cuda:<kernel>",
    None: the cpu engine, when no kernel could take the call); the epilogue is told which (:func:`epilogue`)."""

    values: object
    kernel: Optional[str]


def accumulate(name, a, b_rows, fmt_a, fmt_b, preset, use_fast_accum, splits=1, scheme="none", *,
               context: Context) -> Accumulators:
    """The accumulators of a call on the tensors' CUDA device, computed by the selected kernel ``name``
    ("cuda:<kernel>"), or, when its decline rule declines the call's schedule, by the kernel :func:`choose` picks
    among those below it, with the verdicts of the call's ``context`` (:func:`verdicts_of`), or
    the cpu engine, the result copied to the device. That hand-over is by design: nothing is warned."""
    kernel = name[len("cuda:"):] if name.startswith("cuda:") else name
    if kernel in KERNELS and schedule_skip(kernel, preset, fmt_a, fmt_b, use_fast_accum, splits, scheme):
        kernel = _fallback_kernel(kernel, a.device, preset, fmt_a, fmt_b, use_fast_accum, splits, scheme, context)
        if kernel is None:  # no other kernel can run here: the cpu engine computes, the result goes back
            import torch

            from ...cpu import accumulate_codes
            from ...cpu.features import CPU_ENGINE_ENV

            codes = [t.detach().contiguous().view(torch.uint8).cpu().numpy() for t in (a, b_rows)]
            acc = accumulate_codes(codes[0], codes[1], fmt_a, fmt_b, preset, use_fast_accum, splits, scheme,
                                   cpu_engine=context.environment[CPU_ENGINE_ENV])
            return Accumulators(torch.from_numpy(acc).to(a.device), None)
    acc = REGISTRY[kernel].launch(kernel, a, b_rows, fmt_a, fmt_b, preset, use_fast_accum, splits, scheme)
    return Accumulators(acc, f"cuda:{kernel}")


def _fallback_kernel(declined: str, device, preset, fmt_a, fmt_b, use_fast_accum, splits, scheme, context: Context):
    """The name of the GEMM kernel :func:`choose` picks for a call the kernel ``declined`` does not support by
    design (its schedule), among the kernels below it in priority, with the verdicts of ``context``
    (:func:`verdicts_of`); None if none (then the cpu engine computes). A design decline is not a failure, and
    nothing is announced: a kernel below that fails its self-test is passed over without a warning too (the next
    one, or the cpu engine, returns the same bits)."""
    try:
        info = _device_info(device, context)
    except DeviceUnavailable:
        return None
    verdict = verdicts_of(context)
    kernels = gemm_kernels()
    below = kernels[[k.name for k in kernels].index(declined) + 1:] if declined in [k.name for k in kernels] else []
    choice = choose(below,
                    lambda k: schedule_skip(k.name, preset, fmt_a, fmt_b, use_fast_accum, splits, scheme)
                    or device_skip(k.name, info, preset),
                    lambda k: verdict(info, k.name))
    return None if choice.kernel is None else choice.kernel.name


class EpilogueOutcome(NamedTuple):
    """The epilogue's output tensor on the device (None: the caller runs the CPU epilogue) and the warnings to
    report (a failed self-test of the epilogue kernel)."""

    result: object
    notices: Tuple[Notice, ...]


def epilogue(acc, scale_a, scale_b, scale_result, out_dtype, computed_by: Optional[str], *,
             context: Context) -> EpilogueOutcome:
    """The scaled_mm epilogue on the device of ``acc`` if a GEMM kernel computed ``acc`` (``computed_by``, from
    :class:`Accumulators`; None: a CPU engine did) and :func:`choose` takes the tensor-wise recipe's epilogue kernel
    there (its verdict from the call's ``context``, :func:`verdicts_of`); otherwise no result (the caller then runs
    the CPU epilogue), with the failed self-test as a warning, once per process."""
    if computed_by is None:
        return EpilogueOutcome(None, ())  # a CPU engine computed it (backend "cpu"/"reference", or a fallback)
    found = _epilogue_choice(TENSORWISE, acc.device, context)
    if found is None:
        return EpilogueOutcome(None, ())
    info, choice = found
    if choice.kernel is None:
        return EpilogueOutcome(None, (_fallback_notice(
            info.label, f"mmaemu on {info.label}: {'; '.join(choice.passed_over)}; the cpu epilogue computes "
            "(result copied back to the device)"),))
    return EpilogueOutcome(choice.kernel.launch(acc, scale_a, scale_b, scale_result, out_dtype), ())


def _epilogue_choice(recipe: str, device, context: Context):
    """(the device's facts, the :class:`Choice` by :func:`choose` among ``recipe``'s epilogue kernels on ``device``,
    each with its device decline rule and :func:`entry_verdict` from ``context``), or None when the device cannot
    be used."""
    try:
        info = _device_info(device, context)
    except DeviceUnavailable:
        return None
    verdict = verdicts_of(context)
    return info, choose(candidates(recipe, EPILOGUE), lambda k: device_skip(k.name, info),
                        lambda k: entry_verdict(k, info, verdict))


# The verdict of a kernel without a device self-test of its own, and without another kernel's to run under.
NO_SELFTEST = GateResult("selftest", False, "no device self-test of its own", {}, 0.0, False, ran=False)


def entry_verdict(kernel: KernelInfo, info, verdict: VerdictSource) -> GateResult:
    """The verdict that lets ``kernel`` run on the device of ``info``: its own self-test's (``verdict``), that of
    the kernel it runs under (``kernel.vouched_by``), else :data:`NO_SELFTEST` (no kernel runs on a GPU without a
    verdict; nothing is asked)."""
    if kernel.selftest is not None:
        return verdict(info, kernel.name)
    if kernel.vouched_by is not None:
        return verdict(info, kernel.vouched_by)
    return NO_SELFTEST


def recipe_kernel(recipe: str, name: str, device, *, context: Context) -> Choice:
    """The kernel of the ``recipe``'s candidates (:func:`mmaemu.cuda.catalog.candidates`) that answer to the backend
    ``name`` ("cuda:<kernel>") which computes a call on ``device``, by :func:`choose`: its device decline rule and
    :func:`entry_verdict` with the verdicts of ``context``; no kernel (``kernel`` None, ``passed_over`` says why)
    when none answers, the device cannot be used or every candidate fails. Warns nothing (the caller words it)."""
    asked = name[len("cuda:"):] if name.startswith("cuda:") else None
    answering = [k for k in candidates(recipe) if asked in (k.answers_to, k.name)]
    if not answering:
        return Choice(None, (f"{name}: no {recipe} kernel answers to it",), ())
    try:
        info = _device_info(device, context)
    except DeviceUnavailable as exc:
        return Choice(None, (f"cuda: {exc}",), ())
    verdict = verdicts_of(context)
    return choose(answering, lambda k: device_skip(k.name, info), lambda k: entry_verdict(k, info, verdict))


def rowwise_epilogue(acc, scale_a, scale_b, bias, x_first, *, context: Context) -> EpilogueOutcome:
    """torch's row-wise epilogue (bf16) for accumulators on a CUDA device, by the row-wise recipe's epilogue kernel
    when :func:`choose` takes it there (its verdict: :func:`entry_verdict`, from the call's ``context``); otherwise
    no result (the caller runs the CPU loops and copies the result to the device). Its kernel
    (:func:`.engine.rowwise_epilogue_tensors`, checked under the simulator) has no device self-test yet
    (:data:`NO_SELFTEST`) and no kernel runs on a GPU without a verdict, so today it never runs on a GPU; that is by
    design, not a failure: nothing is warned."""
    found = _epilogue_choice(ROWWISE, acc.device, context)
    if found is None or found[1].kernel is None:
        return EpilogueOutcome(None, ())
    choice = found[1]
    return EpilogueOutcome(choice.kernel.launch(acc, scale_a, scale_b, bias, x_first), ())


def reset():
    """Forget verdicts, selections and probed devices of this process (tests; the once-per-process warnings are
    forgotten by :func:`mmaemu.warn.reset`)."""
    from .. import device as device_module
    from ..verdicts import store

    store.reset()
    with _lock:
        _SELECTIONS.clear()
    device_module.reset()

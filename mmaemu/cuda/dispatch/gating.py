"""Gating and dispatch of the CUDA kernels: self-test verdicts per device, the choice of a kernel for a call, and
the hand-over of a call to the kernel that computes it (platform.md section 4, our own kernels).

One rule chooses a kernel (:func:`choose`: the first that does not decline and whose verdict passes), for the
selection of a backend and for a call the selected kernel declines; each kernel's decline rules are its own
(:data:`mmaemu.cuda.dispatch.launch.DECLINES`, :data:`DEVICE_DECLINES`). Decisions return their warnings as data
(:class:`mmaemu.warn.Notice`): the caller reports them.

Before a kernel is used on a device it must pass its self-test there (:mod:`mmaemu.cuda.verdicts.selftest`: random
and adversarial GEMMs against the CPU reference). Verdicts are cached in memory and on disk, keyed by the device,
its driver, the numba CUDA implementation, the mmaemu version and the sources. Importing this module imports neither
numba.cuda nor torch: that happens when CUDA tensors are seen (:func:`select`), or a status or self-test is asked
for.

Every decision here reads its surroundings from the :class:`mmaemu.context.Context` it is given (``context=``;
None: a direct caller, read now through :func:`mmaemu.context.context_of`): whether CUDA is disabled
(``context.cuda_disabled``), the kernels forced to fail (``context.forced_failures``) and the source of the
verdicts (:func:`verdicts_of`). This module reads no environment itself.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

from ...arith.params import Schedule
from ...context import Context, VerdictSource, context_of
from ...errors import BackendFallbackWarning, BackendUnavailableError
from ...warn import Notice
from ..catalog import KERNELS, NATIVE_INSTRUCTIONS, BackendStatus, GateResult, KernelInfo, Selection, gemm_kernels
from ..device import DISABLED_REASON, DeviceUnavailable
from ..native.devices import device_decline

_lock = threading.RLock()
_VERDICTS: Dict[tuple, GateResult] = {}
_SELECTIONS: Dict[tuple, Selection] = {}  # key -> Selection (with its warnings), of the process's verdicts only
FORCE_FAIL_ENV = "MMAEMU_TEST_FORCE_FAIL"


def _fallback_notice(device_label: str, message: str) -> Notice:
    """A BackendFallbackWarning, once per (device, message) per process."""
    return Notice(BackendFallbackWarning, message, (device_label, message))


def _probe(device):
    """The kernels' view of ``device`` (:func:`mmaemu.cuda.device.probe`; the one step tests replace)."""
    from .. import device as device_module

    return device_module.probe(device)


def _device_info(device, context: Context):
    """The DeviceInfo of ``device`` for a decision of ``context``: DeviceUnavailable ("disabled by
    MMAEMU_DISABLE_CUDA") when the context disables CUDA, before anything is probed (as
    :func:`mmaemu.cuda.device.probe` with ``disabled=True``), else the probe's answer."""
    if context.cuda_disabled:
        raise DeviceUnavailable(DISABLED_REASON)
    return _probe(device)


# A schedule that only the preset and formats shape: one split, fast accumulation (see design_skip).
UNSPLIT_FAST = Schedule(1, 1, 0, 0, 0, 0)
# Kernels with a decline rule for devices, beside the kernel: (device info, preset or None) -> why not, or None.
DEVICE_DECLINES = {"native": device_decline}


def _is_gemm(kernel: str) -> bool:
    return kernel in KERNELS and KERNELS[kernel].kind == "gemm"


def design_skip(kernel: str, preset, fmt_a: str, fmt_b: str):
    """Why ``kernel`` cannot compute this preset by design (None if it can): its decline rule
    (:func:`mmaemu.cuda.dispatch.launch.kernel_decline`) judged on an unsplit fast schedule, i.e. what the preset
    and formats alone rule out. Never a failure, never warned."""
    if _is_gemm(kernel):
        from ...arith.params import preset_params
        from .launch import kernel_decline

        why = kernel_decline(kernel, UNSPLIT_FAST, preset_params(preset, fmt_a, fmt_b))
        if why is not None:
            return f"{why} (preset {preset.name!r})"
    return None


def device_skip(kernel: str, info, preset=None):
    """Why ``kernel`` cannot run on the device of ``info`` (for ``preset``, when given) by design (None if it can):
    the kernel's decline rule for devices (:data:`DEVICE_DECLINES`; ``cuda:native``:
    :func:`mmaemu.cuda.native.devices.device_decline`), None for a kernel without one."""
    rule = DEVICE_DECLINES.get(kernel)
    return None if rule is None else rule(info, preset)


def schedule_skip(kernel: str, preset, fmt_a: str, fmt_b: str, use_fast_accum, splits=1, scheme="none"):
    """Why ``kernel`` cannot compute this call's schedule by design (None if it can): design_skip, plus what the
    schedule rules out (the offset kernel: k-tiles that start on its stages). Never a failure, never warned."""
    skip = design_skip(kernel, preset, fmt_a, fmt_b)
    if skip is not None or not _is_gemm(kernel):
        return skip
    from ...arith.params import preset_params, schedule_params
    from .launch import kernel_decline

    return kernel_decline(kernel, schedule_params(preset, 1, use_fast_accum, splits, scheme),
                          preset_params(preset, fmt_a, fmt_b))


# ----------------------------------------------------------------------------------------------------------------
# Self-tests


def _run_on_device(kernel: str, info):
    """(passed, details) of a kernel's self-test on the device of ``info`` through the torch path."""
    import numpy as np
    import torch

    from ...model.presets import get_preset
    from . import engine
    from ..verdicts import selftest

    dev = torch.device("cuda", info.index)
    if kernel == "epilogue":
        views = {32: (torch.int32, np.uint32), 16: (torch.int16, np.uint16), 8: (torch.int8, np.uint8)}

        def scale(bits):
            return torch.from_numpy(np.array([bits], np.uint32).view(np.float32)).to(dev)

        def compute(acc, sa, sb, sr, out_name):
            out = engine.epilogue_tensors(torch.from_numpy(acc).to(dev), scale(sa), scale(sb),
                                          scale(sr) if sr is not None else None, getattr(torch, out_name))
            signed, unsigned = views[engine.OUT_WIDTH[out_name]]
            return out.view(signed).cpu().numpy().view(unsigned)

        return selftest.run_epilogue_cases(compute)

    probe_details = []
    if kernel == "native":  # the hardware computes its blocks: first the instruction itself, then the GEMMs
        from ..verdicts import probe

        instruction, preset_name, _ = NATIVE_INSTRUCTIONS[tuple(info.capability)]
        with engine._OnDevice(dev) as on:
            passed, details = probe.run_probe(probe.device_runner(instruction, on.stream),
                                              get_preset(preset_name, warn=False))
        probe_details = [{"case": "instruction probe", "mismatches": details["failing_tiles"],
                          "first": details["first"][:2], "probe": details, "reason": probe.summarize(details)}]
        if not passed:
            return False, probe_details

    compute, skip = gemm_case_functions(kernel, info)
    passed, details = selftest.run_gemm_cases(compute, selftest.GEMM_CASES, skip=skip)
    return passed, probe_details + details


def gemm_case_functions(kernel: str, info):
    """(compute, skip) of a GEMM kernel on the device of ``info``, for
    :func:`mmaemu.cuda.verdicts.selftest.run_gemm_cases`: ``compute(case, a, b)`` = its fp32 accumulators of a
    case through the torch path, on the host; ``skip(case)`` = why the dispatcher never gives the case to the
    kernel there (:func:`schedule_skip`, :func:`device_skip`), None if it does."""
    import torch

    from ... import formats
    from ...model.presets import get_preset
    from . import engine

    dev = torch.device("cuda", info.index)

    def compute(case, a, b):
        at = torch.from_numpy(a).to(dev).view(formats.DTYPE_OF[case.fmt_a])
        bt = torch.from_numpy(b).to(dev).view(formats.DTYPE_OF[case.fmt_b])
        acc = engine.accumulate_tensors(kernel, at, bt, case.fmt_a, case.fmt_b, get_preset(case.preset, warn=False),
                                        case.fast, case.splits, case.scheme)
        return acc.cpu().numpy()

    def skip(case):
        preset = get_preset(case.preset, warn=False)
        return schedule_skip(kernel, preset, case.fmt_a, case.fmt_b, case.fast, case.splits, case.scheme) or \
            device_skip(kernel, info, preset)

    return compute, skip


def ensure_verdict(info, kernel: str, *, force: bool = False) -> GateResult:
    """The self-test verdict of ``kernel`` on the device of ``info``: from memory, from disk, or run now (the
    process's verdict source; a decision reads it through :func:`verdicts_of`, which applies forced failures)."""
    from ..verdicts import selftest

    key = selftest.verdict_key(info.identity(), kernel)
    memory_key = (selftest.key_digest(key), kernel)
    why = device_skip(kernel, info)
    if why is not None:
        return GateResult("selftest", False, f"not run: {why}", {}, 0.0, False, ran=False)
    with _lock:
        if not force and memory_key in _VERDICTS:
            return _VERDICTS[memory_key]
        if not force:
            stored = selftest.load_verdict(key)
            if stored is not None:
                result = GateResult("selftest", stored["passed"], stored.get("reason", ""), stored.get("details"),
                                    float(stored.get("seconds", 0.0)), True)
                _VERDICTS[memory_key] = result
                return result
        start = time.perf_counter()
        try:
            passed, details = _run_on_device(kernel, info)
        except Exception as exc:  # compilation or launch failure: remembered for this process, not on disk
            text = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
            result = GateResult("selftest", False, f"self-test raised {text}", {"error": text},
                                time.perf_counter() - start, False)
            _VERDICTS[memory_key] = result
            return result
        seconds = time.perf_counter() - start
        reason = selftest.summarize(details)
        selftest.store_verdict(key, passed, reason, details, seconds)
        result = GateResult("selftest", passed, reason, details, seconds, False)
        _VERDICTS[memory_key] = result
        return result


def forced_failure() -> GateResult:
    """The verdict of a kernel its context forces to fail (``MMAEMU_TEST_FORCE_FAIL``, tests only)."""
    return GateResult("selftest", False, f"forced to fail by {FORCE_FAIL_ENV}", {}, 0.0, False)


def verdicts_of(context: Optional[Context] = None, *, force: bool = False) -> VerdictSource:
    """The verdict source of a decision: (device info, kernel name) -> GateResult.

    The source is ``context.verdicts`` when the context gives one, else the process's own (:func:`ensure_verdict`:
    from memory, from disk, or the self-test run now, rerun when ``force``). A kernel among the context's
    ``forced_failures`` fails (:func:`forced_failure`) whatever the source says, and the source is not asked.
    ``context`` None: read now (:func:`mmaemu.context.context_of`).
    """
    context = context_of(context)
    forced = context.forced_failures
    source = context.verdicts

    def verdict(info, kernel: str) -> GateResult:
        if kernel in forced:
            return forced_failure()
        if source is not None:
            return source(info, kernel)
        return ensure_verdict(info, kernel, force=force)

    return verdict


def run_selftests(device, names: List[str], *, force: bool = False,
                  context: Optional[Context] = None) -> Dict[str, List[GateResult]]:
    """{"cuda:<name>": [GateResult]} for the named kernels on ``device`` (see :func:`mmaemu.backends.selftest`),
    from the verdict source of ``context`` (:func:`verdicts_of`)."""
    context = context_of(context)
    try:
        info = _device_info(device, context)
    except DeviceUnavailable as exc:
        return {f"cuda:{n}": [GateResult("selftest", False, f"not run: {exc}", {}, 0.0, False, ran=False)]
                for n in names}
    verdict = verdicts_of(context, force=force)
    return {f"cuda:{n}": [verdict(info, n)] for n in names}


def _cached_verdict(info, kernel: str):
    from ..verdicts import selftest

    key = selftest.verdict_key(info.identity(), kernel)
    with _lock:
        result = _VERDICTS.get((selftest.key_digest(key), kernel))
    if result is not None:
        return result
    stored = selftest.load_verdict(key)
    if stored is None:
        return None
    return GateResult("selftest", stored["passed"], stored.get("reason", ""), stored.get("details"),
                      float(stored.get("seconds", 0.0)), True)


def _known_verdict(info, kernel: str, context: Context) -> Optional[GateResult]:
    """The verdict of ``kernel`` known without running a self-test: the context's source when it gives one, else
    the process's cached verdict (memory, disk), None when there is none yet."""
    if context.verdicts is not None:
        return context.verdicts(info, kernel)
    return _cached_verdict(info, kernel)


def status(device=None, *, context: Optional[Context] = None) -> Dict[str, BackendStatus]:
    """{"cuda:<name>": BackendStatus} of every kernel on ``device``, from known verdicts (none is run;
    :func:`_known_verdict`), for a decision of ``context`` (None: read now)."""
    context = context_of(context)
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
        verdict = _known_verdict(info, k.name, context)
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


def default_choice(device=None, *, context: Optional[Context] = None) -> DefaultChoice:
    """What ``backend="auto"`` picks for CUDA tensors on ``device`` (None: torch's current CUDA device) by the
    rule of :func:`select`: :func:`choose` over the GEMM kernels by priority, with each kernel's decline rule for
    the device (:func:`device_skip`; the preset is each call's, so design declines are not judged) and the verdicts
    known without running anything (:func:`_known_verdict`, as :func:`status` reads them; a kernel without one yet
    counts as passing: its self-test runs at the first call). ``context``: the decision's (None: read now); its
    forced failures are not applied, as :func:`status` does not apply them. Runs no self-test."""
    context = context_of(context)
    try:
        info = _device_info(device, context)
    except DeviceUnavailable as exc:
        return DefaultChoice(None, False, (), str(exc))
    known: Dict[str, Optional[GateResult]] = {}

    def verdict(kernel: KernelInfo) -> GateResult:
        if kernel.name not in known:
            known[kernel.name] = _known_verdict(info, kernel.name, context)
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


def select(device, name, fmt_a, fmt_b, preset, *, context: Optional[Context] = None) -> Selection:
    """The engine for CUDA tensors on ``device`` (platform.md 4.4 with our kernels), with its warnings as data
    (``Selection.notices``: the caller reports them), from the verdicts of ``context`` (:func:`verdicts_of`; None:
    read now); the process's source runs self-tests on first use.

    A selection from the process's verdicts is kept per device, formats, preset, name and forced failures, and
    gives its warnings again when reused; a context with its own verdict source neither reads nor fills that
    store (its verdicts are not the process's)."""
    context = context_of(context)
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
               context: Optional[Context] = None) -> Accumulators:
    """The accumulators of a call on the tensors' CUDA device, computed by the selected kernel ``name``
    ("cuda:<kernel>"), or, when its decline rule declines the call's schedule, by the kernel :func:`choose` picks
    among those below it, with the verdicts of the call's ``context`` (:func:`verdicts_of`; None: read now), or
    the cpu engine, the result copied to the device. That hand-over is by design: nothing is warned."""
    from . import engine

    kernel = name[len("cuda:"):] if name.startswith("cuda:") else name
    if kernel in KERNELS and schedule_skip(kernel, preset, fmt_a, fmt_b, use_fast_accum, splits, scheme):
        context = context_of(context)
        kernel = _fallback_kernel(kernel, a.device, preset, fmt_a, fmt_b, use_fast_accum, splits, scheme, context)
        if kernel is None:  # no other kernel can run here: the cpu engine computes, the result goes back
            import torch

            from ...cpu import accumulate_codes
            from ...cpu.features import CPU_ENGINE_ENV

            codes = [t.detach().contiguous().view(torch.uint8).cpu().numpy() for t in (a, b_rows)]
            acc = accumulate_codes(codes[0], codes[1], fmt_a, fmt_b, preset, use_fast_accum, splits, scheme,
                                   cpu_engine=context.environment[CPU_ENGINE_ENV])
            return Accumulators(torch.from_numpy(acc).to(a.device), None)
    acc = engine.accumulate_tensors(kernel, a, b_rows, fmt_a, fmt_b, preset, use_fast_accum, splits, scheme)
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
             context: Optional[Context] = None) -> EpilogueOutcome:
    """The scaled_mm epilogue on the device of ``acc`` if a GEMM kernel computed ``acc`` (``computed_by``, from
    :class:`Accumulators`; None: a CPU engine did) and the epilogue kernel passed its self-test there (the verdict
    of the call's ``context``, :func:`verdicts_of`; None: read now); otherwise no result (the caller then runs the
    CPU epilogue), with the failed self-test as a warning, once per process."""
    if computed_by is None:
        return EpilogueOutcome(None, ())  # a CPU engine computed it (backend "cpu"/"reference", or a fallback)
    context = context_of(context)
    try:
        info = _device_info(acc.device, context)
    except DeviceUnavailable:
        return EpilogueOutcome(None, ())
    verdict = verdicts_of(context)(info, "epilogue")
    if not verdict.passed:
        return EpilogueOutcome(None, (_fallback_notice(
            info.label, f"mmaemu on {info.label}: cuda:epilogue: {verdict.reason}; the cpu epilogue computes "
            "(result copied back to the device)"),))
    from . import engine

    return EpilogueOutcome(engine.epilogue_tensors(acc, scale_a, scale_b, scale_result, out_dtype), ())


def rowwise_epilogue(acc, scale_a, scale_b, bias, x_first):
    """torch's row-wise epilogue (bf16), computed by the CPU loops and copied to acc's device. Its CUDA kernel
    (:func:`.engine.rowwise_epilogue_tensors`, checked under the simulator) has no device self-test yet, and no
    kernel runs on a GPU without a verdict of its own, so it is not used on devices."""
    import torch

    from ...cpu import rowwise_epilogue_codes

    def bits(t, view):
        return t.detach().contiguous().reshape(-1).view(view).cpu().numpy()

    out = rowwise_epilogue_codes(acc.cpu().numpy(), bits(scale_a, torch.uint32), bits(scale_b, torch.uint32),
                                 None if bias is None else bits(bias, torch.uint16), x_first)
    return torch.from_numpy(out).view(torch.bfloat16).to(acc.device)


def reset():
    """Forget verdicts, selections and probed devices of this process (tests; the once-per-process warnings are
    forgotten by :func:`mmaemu.warn.reset`)."""
    from .. import device as device_module

    with _lock:
        _VERDICTS.clear()
        _SELECTIONS.clear()
    device_module.reset()

"""Gating and dispatch of the CUDA kernels: self-test verdicts per device, the choice of a kernel for a call, and
the hand-over of a call to the kernel that computes it (platform.md section 4, our own kernels).

Before a kernel is used on a device it must pass its self-test there (:mod:`.selftest`: random and adversarial
GEMMs against the CPU reference). Verdicts are cached in memory and on disk, keyed by the device, its driver, the
numba CUDA implementation, the mmaemu version and the sources. Importing this module imports neither numba.cuda
nor torch: that happens when CUDA tensors are seen (:func:`select`), or a status or self-test is asked for.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Dict, List

from .. import environment
from ..errors import BackendFallbackWarning, BackendUnavailableError
from ..warn import Notice, report
from .catalog import CODES_KERNELS, KERNELS, NATIVE_INSTRUCTIONS, BackendStatus, GateResult, Selection, gemm_kernels
from .device import DeviceUnavailable

_lock = threading.RLock()
_VERDICTS: Dict[tuple, GateResult] = {}
_SELECTIONS: Dict[tuple, tuple] = {}  # key -> (Selection, its warnings)
# Accumulators computed by a kernel (id -> tensor, weakly held): their epilogue stays on the device.
_KERNEL_RESULTS = weakref.WeakValueDictionary()
FORCE_FAIL_ENV = "MMAEMU_TEST_FORCE_FAIL"


def _forced_failures():
    return set(environment.snapshot()[FORCE_FAIL_ENV])


def _fallback_notice(device_label: str, message: str) -> Notice:
    """A BackendFallbackWarning, once per (device, message) per process."""
    return Notice(BackendFallbackWarning, message, (device_label, message))


def _warn_once(device_label: str, message: str):
    report([_fallback_notice(device_label, message)])


def _probe(device):
    from . import device as device_module

    return device_module.probe(device)


def design_skip(kernel: str, preset, fmt_a: str, fmt_b: str):
    """Why ``kernel`` cannot compute this preset by design (None if it can). Never a failure, never warned."""
    if kernel in CODES_KERNELS:
        from ..arith.params import Schedule, preset_params
        from .launch import codes_kernel_decline

        # Judged on an unsplit fast schedule: what the preset and formats alone rule out.
        why = codes_kernel_decline(kernel, Schedule(1, 1, 0, 0, 0, 0), preset_params(preset, fmt_a, fmt_b))
        if why is not None:
            return f"{why} (preset {preset.name!r})"
    return None


def _block(preset):
    return preset.nfma, preset.frac, preset.frac_out, preset.min_exp, preset.late_c


def device_skip(kernel: str, info, preset=None):
    """Why ``kernel`` cannot run on the device of ``info`` (for ``preset``, when given) by design (None if it can).

    ``cuda:native`` issues the FP8 MMA instruction its device runs natively (:data:`NATIVE_INSTRUCTIONS`: sm_90's
    warpgroup MMA, which only numba-cuda compiles, its target being sm_90a; sm_89's mma.sync) and computes that
    instruction's preset only. FP8 ``mma.sync`` on sm_90/sm_100 is not a native FP8 instruction (ptxas rewrites
    it), so it never stands in for the warpgroup MMA.
    """
    if kernel != "native":
        return None
    sm = f"sm_{info.capability[0]}{info.capability[1]}"
    entry = NATIVE_INSTRUCTIONS.get(tuple(info.capability))
    if entry is None:
        known = ", ".join(f"{target} ({name}, {preset_name} preset)"
                          for name, preset_name, target in NATIVE_INSTRUCTIONS.values())
        return f"issues the native FP8 MMA of {known} only, this device is {sm}"
    instruction, preset_name, target = entry
    if target[-1].isalpha() and "numba-cuda" not in info.compiler:  # see mmaemu.cuda.device.compiler_description
        return f"needs numba-cuda to target {target} (pip install 'mmaemu[cuda]'); {info.compiler} cannot"
    if preset is not None:
        from ..model.presets import get_preset

        if _block(preset) != _block(get_preset(preset_name, warn=False)):
            return (f"computes the {preset_name} preset's block on {sm} ({instruction}), preset {preset.name!r} has "
                    "another")
    return None


def schedule_skip(kernel: str, preset, fmt_a: str, fmt_b: str, use_fast_accum, splits=1, scheme="none"):
    """Why ``kernel`` cannot compute this call's schedule by design (None if it can): design_skip, plus what the
    schedule rules out (the offset kernel: k-tiles that start on its stages). Never a failure, never warned."""
    skip = design_skip(kernel, preset, fmt_a, fmt_b)
    if skip is not None or kernel not in CODES_KERNELS:
        return skip
    from ..arith.params import preset_params, schedule_params
    from .launch import codes_kernel_decline

    return codes_kernel_decline(kernel, schedule_params(preset, 1, use_fast_accum, splits, scheme),
                                preset_params(preset, fmt_a, fmt_b))


# ----------------------------------------------------------------------------------------------------------------
# Self-tests


def _run_on_device(kernel: str, info):
    """(passed, details) of a kernel's self-test on the device of ``info`` through the torch path."""
    import numpy as np
    import torch

    from ..model.presets import get_preset
    from . import engine, selftest

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
        from . import probe

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
    """(compute, skip) of a GEMM kernel on the device of ``info``, for :func:`mmaemu.cuda.selftest.run_gemm_cases`:
    ``compute(case, a, b)`` = its fp32 accumulators of a case through the torch path, on the host; ``skip(case)`` =
    why the dispatcher never gives the case to the kernel there (:func:`schedule_skip`, :func:`device_skip`), None
    if it does."""
    import torch

    from .. import formats
    from ..model.presets import get_preset
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
    """The self-test verdict of ``kernel`` on the device of ``info``: from memory, from disk, or run now."""
    from . import selftest

    key = selftest.verdict_key(info.identity(), kernel)
    memory_key = (selftest.key_digest(key), kernel)
    if kernel in _forced_failures():
        return GateResult("selftest", False, f"forced to fail by {FORCE_FAIL_ENV}", {}, 0.0, False)
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


def run_selftests(device, names: List[str], *, force: bool = False) -> Dict[str, List[GateResult]]:
    """{"cuda:<name>": [GateResult]} for the named kernels on ``device`` (see :func:`mmaemu.backends.selftest`)."""
    try:
        info = _probe(device)
    except DeviceUnavailable as exc:
        return {f"cuda:{n}": [GateResult("selftest", False, f"not run: {exc}", {}, 0.0, False, ran=False)]
                for n in names}
    return {f"cuda:{n}": [ensure_verdict(info, n, force=force)] for n in names}


def _cached_verdict(info, kernel: str):
    from . import selftest

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


def status(device=None) -> Dict[str, BackendStatus]:
    """{"cuda:<name>": BackendStatus} of every kernel on ``device``, from cached verdicts (none is run)."""
    try:
        info = _probe(device)
    except DeviceUnavailable as exc:
        return {k.backend: BackendStatus(k.backend, False, None, False, [], f"unavailable: {exc}")
                for k in KERNELS.values()}
    result = {}
    for k in KERNELS.values():
        why = device_skip(k.name, info)
        if why is not None:
            result[k.backend] = BackendStatus(k.backend, False, info.compiler, False, [], f"unavailable: {why}")
            continue
        verdict = _cached_verdict(info, k.name)
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


def select(device, name, fmt_a, fmt_b, preset) -> Selection:
    """The engine for CUDA tensors on ``device`` (platform.md 4.4 with our kernels); runs self-tests on first use."""
    explicit = name[len("cuda:"):] if name.startswith("cuda:") else None
    if explicit is not None and (explicit not in KERNELS or KERNELS[explicit].kind != "gemm"):
        known = ", ".join(f"'cuda:{k.name}'" for k in gemm_kernels())
        raise BackendUnavailableError(f"backend {name!r} cannot run: no such CUDA GEMM kernel (known: {known})")
    try:
        info = _probe(device)
    except DeviceUnavailable as exc:
        reason = f"cuda: {exc}"
        if name == "auto":
            _warn_once(str(device), f"mmaemu: {reason}; the cpu backend computes and the result is copied back to "
                       "the device")
            return Selection("cpu", [reason])
        raise BackendUnavailableError(f"backend {name!r} cannot run: {reason}; use backend='cpu' or 'auto'") from None
    cache_key = (info.index, fmt_a, fmt_b, preset, name, environment.snapshot()[FORCE_FAIL_ENV])
    with _lock:
        cached = _SELECTIONS.get(cache_key)
    if cached is not None:  # its warning is reported again: emitted only if no call has emitted it yet
        selection, notices = cached
        report(notices)
        return Selection(selection.name, list(selection.fallbacks))
    candidates = [KERNELS[explicit]] if explicit is not None else gemm_kernels()
    fallbacks: List[str] = []
    failures: List[str] = []
    chosen = None
    for kernel in candidates:
        skip = design_skip(kernel.name, preset, fmt_a, fmt_b) or device_skip(kernel.name, info, preset)
        if skip is not None:
            fallbacks.append(f"{kernel.backend}: {skip}")
            continue
        verdict = ensure_verdict(info, kernel.name)
        if verdict.passed:
            chosen = kernel.backend
            break
        failures.append(f"{kernel.backend}: {verdict.reason}")
        fallbacks.append(failures[-1])
    if chosen is None and name != "auto":
        raise BackendUnavailableError(f"backend {name!r} cannot run on {info.label}: " + "; ".join(fallbacks))
    selection = Selection(chosen or "cpu", fallbacks)
    notices = ()
    if failures:
        notices = (_fallback_notice(info.label, f"mmaemu on {info.label}: " + "; ".join(failures)
                                    + f"; {selection.name} computes instead"
                                    + (" (result copied back to the device)" if chosen is None else "")),)
    report(notices)
    with _lock:
        _SELECTIONS[cache_key] = (selection, notices)
    return Selection(selection.name, list(selection.fallbacks))


def accumulate(name, a, b_rows, fmt_a, fmt_b, preset, use_fast_accum, splits=1, scheme="none"):
    """fp32 accumulators [M, N] on the tensors' CUDA device, computed by the kernel ``name`` ("cuda:<kernel>")."""
    from . import engine

    kernel = name[len("cuda:"):] if name.startswith("cuda:") else name
    if kernel in KERNELS and schedule_skip(kernel, preset, fmt_a, fmt_b, use_fast_accum, splits, scheme):
        kernel = _next_kernel(kernel, a.device, preset, fmt_a, fmt_b, use_fast_accum, splits, scheme)
        if kernel is None:  # no other kernel can run here: the cpu engine computes, the result goes back
            import torch

            from ..cpu import accumulate_codes

            codes = [t.detach().contiguous().view(torch.uint8).cpu().numpy() for t in (a, b_rows)]
            return torch.from_numpy(accumulate_codes(codes[0], codes[1], fmt_a, fmt_b, preset, use_fast_accum,
                                                     splits, scheme)).to(a.device)
    acc = engine.accumulate_tensors(kernel, a, b_rows, fmt_a, fmt_b, preset, use_fast_accum, splits, scheme)
    _KERNEL_RESULTS[id(acc)] = acc
    return acc


def _next_kernel(declined: str, device, preset, fmt_a, fmt_b, use_fast_accum, splits, scheme):
    """The GEMM kernel that computes a call the kernel ``declined`` does not support by design (its schedule):
    the next one below it in priority that can run the schedule and passed its self-test on ``device``; None if
    none (then the cpu engine computes). A design decline is not a failure: nothing is warned."""
    try:
        info = _probe(device)
    except DeviceUnavailable:
        return None
    below = False
    for kernel in gemm_kernels():
        if kernel.name == declined:
            below = True
            continue
        if not below or schedule_skip(kernel.name, preset, fmt_a, fmt_b, use_fast_accum, splits, scheme) \
                or device_skip(kernel.name, info, preset):
            continue
        if ensure_verdict(info, kernel.name).passed:
            return kernel.name
    return None


def epilogue(acc, scale_a, scale_b, scale_result, out_dtype):
    """The scaled_mm epilogue on the device of ``acc`` if ``acc`` was computed by a kernel (:func:`accumulate`)
    and the epilogue kernel passed its self-test there; None otherwise (the caller then runs the CPU epilogue; a
    failed self-test is warned once)."""
    if _KERNEL_RESULTS.get(id(acc)) is not acc:
        return None  # a CPU engine computed it (backend "cpu"/"reference", or a fallback): keep the CPU path
    try:
        info = _probe(acc.device)
    except DeviceUnavailable:
        return None
    verdict = ensure_verdict(info, "epilogue")
    if not verdict.passed:
        _warn_once(info.label, f"mmaemu on {info.label}: cuda:epilogue: {verdict.reason}; the cpu epilogue computes "
                   "(result copied back to the device)")
        return None
    from . import engine

    return engine.epilogue_tensors(acc, scale_a, scale_b, scale_result, out_dtype)


def rowwise_epilogue(acc, scale_a, scale_b, bias, x_first):
    """torch's row-wise epilogue (bf16), computed by the CPU loops and copied to acc's device. Its CUDA kernel
    (:func:`mmaemu.cuda.engine.rowwise_epilogue_tensors`, checked under the simulator) has no device self-test yet,
    and no kernel runs on a GPU without a verdict of its own, so it is not used on devices."""
    import torch

    from ..cpu import rowwise_epilogue_codes

    def bits(t, view):
        return t.detach().contiguous().reshape(-1).view(view).cpu().numpy()

    out = rowwise_epilogue_codes(acc.cpu().numpy(), bits(scale_a, torch.uint32), bits(scale_b, torch.uint32),
                                 None if bias is None else bits(bias, torch.uint16), x_first)
    return torch.from_numpy(out).view(torch.bfloat16).to(acc.device)


def reset():
    """Forget verdicts, selections and probed devices of this process (tests; the once-per-process warnings are
    forgotten by :func:`mmaemu.warn.reset`)."""
    from . import device as device_module

    with _lock:
        _VERDICTS.clear()
        _SELECTIONS.clear()
    device_module.reset()

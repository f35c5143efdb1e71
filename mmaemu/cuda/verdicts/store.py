"""The verdict store: the self-test verdict of each CUDA kernel on each device, kept in memory and on disk, and the
verdict source a decision reads (platform.md section 4, our own kernels).

Before a kernel is used on a device it must pass its self-test there: the cases its registry entry names
(:attr:`mmaemu.cuda.catalog.KernelInfo.selftest`; :mod:`mmaemu.cuda.verdicts.selftest`: random and adversarial
GEMMs against the CPU reference, the epilogue's special and random accumulators), after the instruction probe for
a gated kernel (:mod:`mmaemu.cuda.verdicts.probe`). A verdict is kept in memory for the process and on disk
(:func:`mmaemu.cuda.verdicts.selftest.store_verdict`), keyed by the device's identity
(:meth:`mmaemu.base.device_facts.DeviceFacts.identity`: name, driver, the numba CUDA implementation, torch), the mmaemu
version and the sources; a self-test that raises is remembered for the process only.

A decision reads verdicts through :func:`verdicts_of` (the source of its :class:`mmaemu.context.Context`, else this
store; the context's forced failures first); a status, :func:`known_verdict` (none is run). This module reads no
environment, and importing it imports neither numba.cuda nor torch.
"""

from __future__ import annotations

import threading
import time
from typing import Dict, Optional

from ...context import Context, VerdictSource
from ..catalog import EPILOGUE, NATIVE_INSTRUCTIONS, REGISTRY, GateResult

FORCE_FAIL_ENV = "MMAEMU_TEST_FORCE_FAIL"

_lock = threading.RLock()
_VERDICTS: Dict[tuple, GateResult] = {}


def _stored_result(stored: dict) -> GateResult:
    """The GateResult of a verdict read from disk."""
    return GateResult("selftest", stored["passed"], stored.get("reason", ""), stored.get("details"),
                      float(stored.get("seconds", 0.0)), True)


def _keys(info, kernel: str):
    """(disk key, memory key) of the verdict of ``kernel`` on the device of ``info``."""
    from . import selftest

    key = selftest.verdict_key(info.identity(), kernel)
    return key, (selftest.key_digest(key), kernel)


def _run_on_device(kernel: str, info):
    """(passed, details) of a kernel's self-test on the device of ``info`` through the torch path: the cases of
    its registry entry, after the instruction probe for a gated kernel."""
    import numpy as np
    import torch

    from ...model.presets import get_preset
    from ..dispatch import engine
    from . import selftest

    dev = torch.device("cuda", info.index)
    entry = REGISTRY[kernel]
    if entry.selftest == EPILOGUE:
        views = {32: (torch.int32, np.uint32), 16: (torch.int16, np.uint16), 8: (torch.int8, np.uint8)}

        def scale(bits):
            return torch.from_numpy(np.array([bits], np.uint32).view(np.float32)).to(dev)

        def compute(acc, sa, sb, sr, out_name):
            out = entry.launch(torch.from_numpy(acc).to(dev), scale(sa), scale(sb),
                               scale(sr) if sr is not None else None, getattr(torch, out_name))
            signed, unsigned = views[engine.OUT_WIDTH[out_name]]
            return out.view(signed).cpu().numpy().view(unsigned)

        return selftest.run_epilogue_cases(compute)

    probe_details = []
    if entry.gated:  # the hardware computes its blocks: first the instruction itself, then the GEMMs
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
    """(compute, skip) of a GEMM kernel on the device of ``info``, for
    :func:`mmaemu.cuda.verdicts.selftest.run_gemm_cases`: ``compute(case, a, b)`` = its fp32 accumulators of a
    case through the torch path (its entry's launch), on the host; ``skip(case)`` = why the dispatcher never gives
    the case to the kernel there (:func:`mmaemu.cuda.dispatch.declines.schedule_skip`, ``device_skip``), None if it
    does."""
    import torch

    from ... import formats
    from ...model.presets import get_preset
    from ..dispatch.declines import device_skip, schedule_skip

    dev = torch.device("cuda", info.index)
    launch = REGISTRY[kernel].launch

    def compute(case, a, b):
        at = torch.from_numpy(a).to(dev).view(formats.DTYPE_OF[case.fmt_a])
        bt = torch.from_numpy(b).to(dev).view(formats.DTYPE_OF[case.fmt_b])
        acc = launch(kernel, at, bt, case.fmt_a, case.fmt_b, get_preset(case.preset, warn=False), case.fast,
                     case.splits, case.scheme)
        return acc.cpu().numpy()

    def skip(case):
        preset = get_preset(case.preset, warn=False)
        return schedule_skip(kernel, preset, case.fmt_a, case.fmt_b, case.fast, case.splits, case.scheme) or \
            device_skip(kernel, info, preset)

    return compute, skip


def ensure_verdict(info, kernel: str, *, force: bool = False) -> GateResult:
    """The self-test verdict of ``kernel`` on the device of ``info``: from memory, from disk, or run now (the
    process's verdict source; a decision reads it through :func:`verdicts_of`, which applies forced failures)."""
    from ..dispatch.declines import device_skip
    from . import selftest

    key, memory_key = _keys(info, kernel)
    why = device_skip(kernel, info)
    if why is not None:
        return GateResult("selftest", False, f"not run: {why}", {}, 0.0, False, ran=False)
    with _lock:
        if not force and memory_key in _VERDICTS:
            return _VERDICTS[memory_key]
        if not force:
            stored = selftest.load_verdict(key)
            if stored is not None:
                _VERDICTS[memory_key] = _stored_result(stored)
                return _VERDICTS[memory_key]
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


def verdicts_of(context: Context, *, force: bool = False) -> VerdictSource:
    """The verdict source of a decision of ``context``: (device facts, kernel name) -> GateResult.

    The source is ``context.verdicts`` when the context gives one, else the process's own (:func:`ensure_verdict`:
    from memory, from disk, or the self-test run now, rerun when ``force``). A kernel among the context's
    ``forced_failures`` fails (:func:`forced_failure`) whatever the source says, and the source is not asked.
    """
    forced = context.forced_failures
    source = context.verdicts

    def verdict(info, kernel: str) -> GateResult:
        if kernel in forced:
            return forced_failure()
        if source is not None:
            return source(info, kernel)
        return ensure_verdict(info, kernel, force=force)

    return verdict


def cached_verdict(info, kernel: str) -> Optional[GateResult]:
    """The process's verdict of ``kernel`` on the device of ``info`` from memory or disk, None when none is kept
    (nothing is run)."""
    from . import selftest

    key, memory_key = _keys(info, kernel)
    with _lock:
        result = _VERDICTS.get(memory_key)
    if result is not None:
        return result
    stored = selftest.load_verdict(key)
    return None if stored is None else _stored_result(stored)


def known_verdict(info, kernel: str, context: Context) -> Optional[GateResult]:
    """The verdict of ``kernel`` known without running a self-test: the context's source when it gives one, else
    the process's cached verdict (memory, disk), None when there is none yet."""
    if context.verdicts is not None:
        return context.verdicts(info, kernel)
    return cached_verdict(info, kernel)


def reset():
    """Forget the verdicts of this process (tests)."""
    with _lock:
        _VERDICTS.clear()

"""The context of the decisions: what mmaemu knows about its surroundings at one moment, as one immutable value.

The policy layers decide from a :class:`Context` instead of reading the surroundings themselves: the profile
choice (:func:`mmaemu.platform.profiles.get_profile`), the split-K decision
(:func:`mmaemu.platform.splitk.decide_splitk`), the backend selection (:func:`mmaemu.backends.select`) and the
CUDA kernel choice (:func:`mmaemu.cuda.select`) take ``context=`` and return data (the profile, the decision with
its warnings, the selection with its fallbacks). Only the entry points build a context: a call that is planned
gets one from :func:`for_call` (``explain``, :mod:`mmaemu.patching`, and the plan cache of
:mod:`mmaemu.plan.cache` behind ``scaled_mm``, ``accumulate`` and the ``nn`` layers, on a miss), which its plan
keeps for what is decided while it computes, and ``mmaemu info`` one with the device facts
(:func:`mmaemu.cli.diagnostics.report_context`), so a call sees one reading of the environment from its first
decision to its last. A decision called without a context (a test, a script) reads the environment then
(:func:`environment_of`).

Beside the environment and the device, a context names the sources of the facts that are read on first use: the
split-K tables (``tables``: a table id -> its :class:`mmaemu.platform.tables.SplitTable`), the recorded profiles
of the bundles (``recorded``: the value of ``MMAEMU_PROFILE_PATH`` -> {name: Profile}) and the kernels' self-test
verdicts (``verdicts``: (device info, kernel name) -> :class:`mmaemu.cuda.catalog.GateResult`), and the AVX2 offset
engine's self-test verdict (``cpu_selftest``: () -> :class:`mmaemu.cpu.selftest.OffsetSelftest`). A source answers
when a decision first asks and remembers its answer for the process, so a CPU call never touches CUDA and never
loads a table it does not consult; None stands for the process's own source (the package's tables and the loaded
bundles, the verdicts cached in memory and on disk, run on first use), which the layer that owns it supplies
(:func:`mmaemu.platform.tables.tables_of`, :func:`mmaemu.platform.bundles.recorded_of`,
:func:`mmaemu.cuda.verdicts.store.verdicts_of`, :func:`mmaemu.cpu.engine.selftest_of`). A test or a caller gives a
decision other facts by giving it a context with other sources; no module global is patched.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

from . import environment
from .base.device_facts import DeviceFacts

__all__ = ["Context", "for_call", "context_of", "environment_of", "TableSource", "RecordedSource", "VerdictSource",
           "CpuSelftestSource"]

# The sources of the facts read on first use (see the module docstring); the types are named, not imported, so
# that the context stays below the layers that own them.
TableSource = Callable[[str], Any]  # table id -> SplitTable (KeyError-free: an unknown id raises SplitTableError)
RecordedSource = Callable[[str], Mapping[str, Any]]  # MMAEMU_PROFILE_PATH value -> {name: recorded Profile}
VerdictSource = Callable[[Any, str], Any]  # (DeviceFacts of a CUDA device, kernel name) -> GateResult
CpuSelftestSource = Callable[[], Any]  # () -> mmaemu.cpu.selftest.OffsetSelftest (the AVX2 offset engine's verdict)


@dataclasses.dataclass(frozen=True)
class Context:
    """The surroundings of the decisions, read at the edge.

    ``environment``: the parsed ``MMAEMU_*`` variables (:func:`mmaemu.environment.snapshot`). ``device``: the facts
    of the CUDA device described (``mmaemu info``; :class:`mmaemu.base.device_facts.DeviceFacts`), None when none was
    read; then ``device_problem`` says why (CUDA disabled, no device, "probe failed") and ``device_error`` what
    reading it raised, if it raised. ``tables``, ``recorded`` and ``verdicts``: the sources of the split-K tables,
    the recorded profiles and the kernels' verdicts; ``cpu_selftest``: that of the AVX2 offset engine's self-test
    verdict (:mod:`mmaemu.cpu.selftest`) (None: the process's; see the module docstring).
    """

    environment: environment.Snapshot
    device: Optional[DeviceFacts] = None
    device_problem: Optional[str] = None
    device_error: Optional[str] = None
    tables: Optional[TableSource] = None
    recorded: Optional[RecordedSource] = None
    verdicts: Optional[VerdictSource] = None
    cpu_selftest: Optional[CpuSelftestSource] = None

    @property
    def cuda_disabled(self) -> bool:
        """``MMAEMU_DISABLE_CUDA`` is true: no decision may touch CUDA."""
        return bool(self.environment["MMAEMU_DISABLE_CUDA"])

    @property
    def forced_failures(self) -> frozenset:
        """The kernels ``MMAEMU_TEST_FORCE_FAIL`` names (tests only): their verdicts fail whatever the source says."""
        return frozenset(self.environment["MMAEMU_TEST_FORCE_FAIL"])

    @property
    def profile_path(self) -> str:
        """``MMAEMU_PROFILE_PATH`` (empty when unset): the folders of the recorded bundles to load."""
        return self.environment["MMAEMU_PROFILE_PATH"] or ""


def for_call() -> Context:
    """The context of one API call: the environment as it is now (the device is read later, for CUDA tensors)."""
    return Context(environment.snapshot())


def context_of(context: Optional[Context]) -> Context:
    """The context of a decision: the one it was given, or (a decision called without one, by a test or by code
    outside the entry points) the context of this moment, :func:`for_call`."""
    return for_call() if context is None else context


def environment_of(context: Optional[Context]) -> environment.Snapshot:
    """The environment snapshot of a decision: that of :func:`context_of` (its context's, or the environment as it
    is now)."""
    return context_of(context).environment

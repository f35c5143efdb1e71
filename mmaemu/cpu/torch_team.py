"""torch's OpenMP team as the threads of a CPU call, where torch is loaded and runs on GNU OpenMP.

Why: after each of its parallel operations (every operation of 32,768 elements or more), torch's GNU OpenMP
workers spin, by default 300,000 polls (about 8 ms of a core), before they sleep (docs/performance.md, "MiniLM and
torch's waiting workers"). A model's GEMMs follow its other operations (a norm, the attention, an activation), so
a call on mmaemu's own pool ran beside a spinning worker: three busy threads on two cores. Run on torch's own team
instead (``GOMP_parallel`` of the libgomp torch loaded, called from the thread that calls mmaemu), the spinning
worker is the one that takes the tasks: the region ends its wait, as the next torch operation would.

What this changes in the process: nothing torch or the user set. The team, its size and its wait policy are
torch's (``torch.set_num_threads``, ``OMP_*``); mmaemu starts a parallel region on it as any torch operation does,
and after it the workers wait as after any torch operation.

When it is used (:func:`team_decline` says why not, otherwise): torch is imported (mmaemu never imports it for
this), its parallel backend is OpenMP on GNU's runtime (a ``libgomp`` loaded from torch's own ``lib`` folder; the
library is looked up among those already loaded, never loaded), the call comes from the main thread, not from
inside another call on the team, of a process that is not a forked child (GNU OpenMP's team does not survive a
fork) and is not shutting down, that thread computes with gradual underflow (:mod:`mmaemu.base.fpmode`), and
torch's team has at least the call's threads. A member of the team that flushes subnormals takes no task (the
others take them all): mmaemu does not change the mode of torch's threads. On a busy machine torch's worker may
join a region late (it had no core), and the caller waits for it at the region's end: after a few such regions in a
row the calls run on mmaemu's pool for a second (:data:`LATE_JOIN`, :data:`LATE_STREAK`, :data:`AVOID_SECONDS`).
(A task that needs MXCSR's rounding sets it and restores it around its kernel, as on any thread:
:func:`mmaemu.cpu.simd.call_restoring_mxcsr`.)
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from typing import Callable, Optional

from ..base.fpmode import fp32_subnormals_flushed

_TEAM_FUNCTION = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

# A worker of torch's team that joins a region this late had no core for it (a busy machine: more threads ready
# than cores), and the caller waits for it at the region's end; after LATE_STREAK such regions in a row the pool
# takes the calls for a while (one late join, a worker woken from its sleep on an idle core, is not a busy machine).
# Measured (docs/performance.md, "Stop 42: torch's team"): at load 4 on 2 cores a layer's call took 9.2 ms on the
# team against 0.67 ms on the pool, its worker joining 1.4 ms late in the median region, 5 ms in one of ten.
LATE_JOIN = 1e-3  # seconds
LATE_STREAK = 3
AVOID_SECONDS = 1.0


class _Team:
    """The GNU OpenMP entry points of torch's libgomp, and the one region this process runs on it at a time."""

    def __init__(self, library):
        self.parallel = library.GOMP_parallel
        self.parallel.argtypes = [_TEAM_FUNCTION, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        self.parallel.restype = None
        self.max_threads = library.omp_get_max_threads
        self.max_threads.argtypes = []
        self.max_threads.restype = ctypes.c_int
        self.member = None  # the running region's work: a callable without arguments
        self.caller = None  # the thread that started it
        self.raised = None  # what its calls raised
        self.joined = None  # when the first worker joined it (time.perf_counter)
        self.avoid_until = None  # time.monotonic() until which the pool takes the calls (a late worker)
        self.late_streak = 0  # regions in a row that a worker joined late
        self.entry = _TEAM_FUNCTION(self._enter)  # kept alive as long as the team

    def _enter(self, _data) -> None:
        # Nothing may escape a callback from C (ctypes would print it and drop it, a Ctrl-C included).
        try:
            # threading.current_thread() would register a dummy Thread for each of torch's workers at every region
            if threading.get_ident() == self.caller:
                self.member()
            else:
                if self.joined is None:
                    self.joined = time.perf_counter()
                if not fp32_subnormals_flushed():
                    self.member()
        except BaseException as error:
            self.raised.append(error)

    def run(self, member: Callable[[], None], n_threads: int) -> None:
        """``member()`` on ``n_threads`` threads of the team (the calling thread one of them); return when every
        call has returned, raising the first exception that one of them raised. Where a worker joined LATE_STREAK
        regions in a row more than LATE_JOIN seconds after their start (it had no core: a busy machine, where the
        caller waits for it at each region's end), :func:`team` declines for AVOID_SECONDS."""
        self.member, self.caller, self.raised, self.joined = member, threading.get_ident(), [], None
        start = time.perf_counter()
        try:
            self.parallel(self.entry, None, n_threads, 0)
            joined = time.perf_counter() if self.joined is None else self.joined
            self.late_streak = self.late_streak + 1 if joined - start > LATE_JOIN else 0
            if self.late_streak >= LATE_STREAK:
                self.avoid_until, self.late_streak = time.monotonic() + AVOID_SECONDS, 0
            if self.raised:
                raise self.raised[0]
        finally:
            self.member = self.caller = self.raised = self.joined = None

    def avoided(self) -> bool:
        """Whether a late worker was seen less than AVOID_SECONDS ago (:meth:`run`)."""
        return self.avoid_until is not None and time.monotonic() < self.avoid_until


_TEAM: Optional[_Team] = None
_TEAM_WHY: Optional[str] = None  # why torch's team was not found, once looked for
_LOOKED = False
_FORKED = False


def _forget_team_in_child():
    global _FORKED
    _FORKED = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_team_in_child)


def _loaded_libgomp(torch_lib: str) -> Optional[str]:
    """The path of a libgomp loaded from torch's ``lib`` folder, from this process's map of loaded files."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1]
                name = os.path.basename(path)
                if name.startswith("libgomp") and ".so" in name and os.path.dirname(path) == torch_lib:
                    return path
    except OSError:
        return None
    return None


def _find_team(torch) -> tuple:
    """(team, None) or (None, why not)."""
    try:
        info = torch.__config__.parallel_info()
    except Exception as error:  # a torch without the report: no team
        return None, f"torch.__config__.parallel_info() failed ({error})"
    if "ATen parallel backend: OpenMP" not in info:
        return None, "torch's parallel backend is not OpenMP"
    path = _loaded_libgomp(os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "lib"))
    if path is None:
        return None, "no GNU OpenMP runtime (libgomp) is loaded from torch's lib folder"
    try:
        library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        return _Team(library), None
    except (OSError, AttributeError) as error:
        return None, f"torch's libgomp has no usable GOMP_parallel ({error})"


def team(n_threads: int) -> Optional[_Team]:
    """torch's team for a call of ``n_threads`` threads from this thread, or None (module docstring)."""
    global _TEAM, _TEAM_WHY, _LOOKED
    if (n_threads < 2 or _FORKED or threading.get_ident() != threading.main_thread().ident
            or sys.is_finalizing()):  # a foreign thread cannot take the GIL while the interpreter ends
        return None
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if not _LOOKED:
        _TEAM, _TEAM_WHY = _find_team(torch)
        _LOOKED = True
    if (_TEAM is None or _TEAM.member is not None or _TEAM.avoided() or _TEAM.max_threads() < n_threads
            or fp32_subnormals_flushed()):
        return None
    return _TEAM


def team_decline() -> Optional[str]:
    """Why calls do not run on torch's team (None where they do, from the main thread)."""
    if _FORKED:
        return "this process forked (GNU OpenMP's team does not survive a fork)"
    if "torch" not in sys.modules:
        return "torch is not imported"
    return _TEAM_WHY

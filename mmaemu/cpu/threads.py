"""Threads of the CPU backend: mmaemu's own pool of threads, the thread count, and how a loop is cut into tasks.

mmaemu does not use Numba's threading layer and never changes it (``NUMBA_THREADING_LAYER``,
``numba.config.THREADING_LAYER`` and the layer Numba picks stay the user's). Its loops are plain compiled
functions that release the GIL (``nogil``, :mod:`mmaemu.base._jit`), each called on a range of jobs (a *task*); the
tasks of a call run on at most :func:`num_threads` threads at a time: a process-wide pool of Python threads
(``concurrent.futures``), or, for a call from the main thread of a process where torch runs on GNU OpenMP, torch's
own OpenMP team, the calling thread among them (:mod:`mmaemu.cpu.torch_team`: torch's workers spin after each of
its operations, and a pool beside them was three busy threads on two cores). Why, rather than ``prange`` on some
Numba layer:

* other Numba code in the process is safe whatever layer it uses: mmaemu never enters a Numba parallel region, so
  it can neither nest nor overlap one (with the ``workqueue`` layer, two parallel regions at once abort the
  process);
* calls from several threads at once are safe: their tasks share the pool;
* ``fork`` is safe: no lock is held across a call, and a child process drops the parent's pool
  (``os.register_at_fork``) and starts its own on its first call (GNU OpenMP, Numba's ``omp`` layer, is not
  fork-safe);
* Ctrl-C lands at once: the calling thread only waits for the tasks (on torch's team it takes tasks and returns
  to Python between them), and an interrupt stops handing them out (the running ones, each at most about
  TASK_WORK products, end by themselves within milliseconds);
* idle pool threads sleep on a queue, so they leave the cores to BLAS at once after a call (GNU OpenMP's workers
  spin for a while, which made the next ``np.dot`` about 40 % slower: docs/performance.md). After a call on
  torch's team, torch's workers wait as they do after any torch operation (their policy: ``OMP_WAIT_POLICY``).

Task sizes, in products of the fast path (one costs about 0.1 ns of a core on the measured machine; the other
loops state their cost in these units): at most TASK_WORK (about 3.5 ms of a core: the tasks still running when
an interrupt lands end within that, and handing out a task, a few microseconds, costs about 0.2 %), at least
MIN_TASK_WORK (about 0.1 ms) where there are enough jobs to give every thread TASKS_PER_THREAD tasks (which evens
out the load). Measured in docs/performance.md.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading

import numba
from numba.np.ufunc import parallel as _numba_parallel

from ..base.fpmode import fp32_subnormals_flushed
from . import torch_team

TASK_WORK = 1 << 25
MIN_TASK_WORK = 1 << 20
TASKS_PER_THREAD = 4

_POOL = None
_POOL_LOCK = threading.Lock()


def max_threads() -> int:
    """Size of the pool: ``NUMBA_NUM_THREADS`` (every core by default)."""
    return numba.config.NUMBA_NUM_THREADS


def num_threads() -> int:
    """Threads a call uses: ``numba.get_num_threads()`` of the calling thread (``numba.set_num_threads``) where
    Numba's thread pool is already running, else ``NUMBA_NUM_THREADS`` (reading the former would start Numba's
    threading layer, which then can no longer be chosen by the user)."""
    if getattr(_numba_parallel, "_is_initialized", False):
        return numba.get_num_threads()
    return max_threads()


def _gradual_underflow():
    """Start a pool thread in IEEE mode. A new thread inherits the floating-point mode of the thread that starts it
    (on Linux), so a pool started from a thread in flush-to-zero / denormals-are-zero mode (``torch.
    set_flush_denormal(True)``, or a library built with ``-ffast-math`` loaded there) would flush subnormals in
    every later task, where the callers' own threads are checked (:mod:`mmaemu.plan.flush`). The pool threads are
    mmaemu's own: setting their mode changes nothing of the user's. torch, which sets the mode, is imported only
    where the thread flushes: a process that has not imported it (``mmaemu.cpu`` on numpy arrays) would otherwise
    pay its import, about a second, at its first call that runs on the pool."""
    if fp32_subnormals_flushed():
        import torch

        torch.set_flush_denormal(False)


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(max_threads(), thread_name_prefix="mmaemu-cpu",
                                                          initializer=_gradual_underflow)
        return _POOL


def _forget_pool_in_child():
    """After fork: the parent's pool threads do not exist here; the next call starts a new pool."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def jobs_per_task(n_jobs: int, job_work: int, n_threads: int, repeats: int = 1) -> int:
    """Jobs per task for ``repeats`` loops of ``n_jobs`` jobs each: as many as fit in TASK_WORK, fewer to give every
    thread TASKS_PER_THREAD tasks, but not under MIN_TASK_WORK (at least one job)."""
    most = max(1, TASK_WORK // max(1, job_work))
    spread = (n_jobs * repeats) // (TASKS_PER_THREAD * n_threads)
    least = -(-MIN_TASK_WORK // max(1, job_work))
    return max(1, min(most, max(spread, least)))


def job_ranges(n_jobs: int, job_work: int, n_threads: int, repeats: int = 1):
    """[lo, hi) ranges of :func:`jobs_per_task` jobs covering range(n_jobs)."""
    step = jobs_per_task(n_jobs, job_work, n_threads, repeats)
    return [(lo, min(lo + step, n_jobs)) for lo in range(0, n_jobs, step)]


def task_groups(works, least: int = MIN_TASK_WORK):
    """[lo, hi) ranges of consecutive tasks (their costs ``works``, in products) covering them, each of at least
    ``least`` products where the tasks have that much (a short last group joins the one before): tasks smaller than
    that are handed out together, and a call of fewer than 2 * ``least`` products runs as one group."""
    groups, lo, total = [], 0, 0
    for i, work in enumerate(works):
        total += work
        if total >= least:
            groups.append((lo, i + 1))
            lo, total = i + 1, 0
    if lo < len(works):
        if groups:
            groups[-1] = (groups[-1][0], len(works))
        else:
            groups.append((lo, len(works)))
    return groups


def run_tasks(tasks, works=None) -> None:
    """Call every callable of ``tasks`` once, on at most :func:`num_threads` threads (torch's team where
    :func:`mmaemu.cpu.torch_team.team` offers it, else the pool); return when all have run. The first exception of
    a task, or an interrupt of the calling thread, stops handing out the rest and is raised (tasks already running
    finish by themselves). ``works``: the tasks' costs in products, if known: consecutive tasks are then handed out
    in groups (:func:`task_groups`), and a call of one group runs on the calling thread (handing a task to the pool
    costs microseconds, waking a sleeping thread more on a busy machine)."""
    tasks = list(tasks)
    if works is not None:
        groups = task_groups(works)
        if len(groups) < len(tasks):
            tasks = [lambda group=tasks[lo:hi]: _run_each(group) for lo, hi in groups]
    n_threads = min(num_threads(), len(tasks))
    if n_threads <= 1:
        for task in tasks:
            task()
        return
    handout = iter(tasks)
    handout_lock = threading.Lock()
    stop = threading.Event()

    def worker():
        while not stop.is_set():
            with handout_lock:
                task = next(handout, None)
            if task is None:
                return
            try:
                task()
            except BaseException:
                stop.set()
                raise

    team = torch_team.team(n_threads)
    if team is not None:
        team.run(worker, n_threads)  # the first exception of a task, or an interrupt, raised here
    else:
        _run_on_pool(worker, n_threads, stop)


def _run_on_pool(worker, n_threads: int, stop: threading.Event) -> None:
    futures = []
    try:
        for _ in range(n_threads):
            futures.append(_pool().submit(worker))
    except RuntimeError:  # the interpreter is shutting down (no new threads): this thread takes part
        worker()
    try:
        for future in futures:
            future.result()
    except BaseException:
        stop.set()
        raise


def _run_each(tasks) -> None:
    for task in tasks:
        task()


def parallel_for(kernel, n_jobs: int, job_work: int, *args) -> None:
    """``kernel(lo, hi, *args)`` for [lo, hi) ranges covering range(n_jobs), in parallel (see the module
    docstring). ``job_work``: the cost of one job in products of the fast path."""
    ranges = job_ranges(n_jobs, job_work, num_threads())
    if len(ranges) == 1:  # one task: on the calling thread, without the task machinery
        kernel(*ranges[0], *args)
        return
    run_tasks(lambda lo=lo, hi=hi: kernel(lo, hi, *args) for lo, hi in ranges)

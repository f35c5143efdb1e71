"""Threads of the CPU backend: Numba's threading layer, thread count and work distribution.

Threading layer. Unless the user chose one (``NUMBA_THREADING_LAYER`` or ``numba.config.THREADING_LAYER``
set to anything but the default), importing :mod:`mmaemu.cpu` asks Numba for the ``workqueue`` layer when
the first parallel loop starts. Reasons, measured in ``docs/performance.md``:

* its idle workers sleep instead of spinning, so right after an mmaemu call they leave the cores to BLAS
  (NumPy's OpenBLAS, torch's OpenMP pool). GNU OpenMP (Numba's ``omp`` layer; TBB is not installed here) keeps
  idle workers spinning after every parallel region (``GOMP_SPINCOUNT``): on the measured 2-core machine a
  float64 ``np.dot`` issued right after an ``omp``-layer mmaemu call took 24.5 ms instead of 17 ms, after a
  ``workqueue`` call 17-18 ms;
* it is fork-safe (GNU OpenMP is not: a forked child that runs an OpenMP region can hang).

The other direction is BLAS's business: OpenBLAS workers spin for about 0.1 s after each call and slow down an
mmaemu call made in that window on either layer (63 ms became 115-128 ms in the same test); setting
``OPENBLAS_THREAD_TIMEOUT=4`` before NumPy is imported makes them sleep at once (the call then took 62-64 ms).

Its limit: one parallel region at a time per process. Two Python threads calling mmaemu at once would make
Numba abort, so :func:`parallel_region` serialises the CPU backend's parallel loops with a lock (each one
already uses every core).

Work distribution: Numba's default static split of each ``prange`` (equal shares per thread); the fast path
makes many more jobs than threads (see :func:`mmaemu.cpu.engine.tile_shape`). Handing jobs out in chunks
(``numba.set_parallel_chunksize``) changed nothing measurable, even with a core taken by another process.
"""

from __future__ import annotations

import contextlib
import os
import threading

import numba

PREFERRED_LAYER = "workqueue"
_LOCK = threading.RLock()


def _choose_layer():
    """Select PREFERRED_LAYER unless the user set one (environment or numba.config) before us."""
    if os.environ.get("NUMBA_THREADING_LAYER"):
        return
    if numba.config.THREADING_LAYER != "default":
        return
    numba.config.THREADING_LAYER = PREFERRED_LAYER


_choose_layer()


def num_threads() -> int:
    """Threads the parallel loops use (``numba.set_num_threads`` / ``NUMBA_NUM_THREADS``)."""
    return numba.get_num_threads()


def max_threads() -> int:
    """Size of Numba's thread pool (NUMBA_NUM_THREADS): every thread id of a parallel loop is below it."""
    return numba.config.NUMBA_NUM_THREADS


def threading_layer() -> str:
    """The layer Numba runs on ("workqueue", "omp", "tbb"), or the configured one before the first launch."""
    try:
        return numba.threading_layer()
    except ValueError:  # no parallel loop has run yet
        return numba.config.THREADING_LAYER


@contextlib.contextmanager
def parallel_region():
    """Serialise the CPU backend's parallel loops (the workqueue layer runs one parallel region at a time)."""
    with _LOCK:
        yield

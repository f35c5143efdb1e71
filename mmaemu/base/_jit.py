"""The one decorator of mmaemu's arithmetic: a plain Numba ``njit`` that releases the GIL, cached on disk.

Every arithmetic function is compiled from the same Python source for the CPU loops (:mod:`mmaemu.cpu`) and,
when called from a ``@cuda.jit`` kernel, for the GPU (:mod:`mmaemu.cuda`). The CPU loops run on mmaemu's own
threads (:mod:`mmaemu.cpu.threads`), hence ``nogil``. The cache folder is chosen by :mod:`mmaemu.base._cache` (keyed
by the package version and a hash of the arithmetic's sources) and its entries are read and written by
:mod:`mmaemu.base._numba_cache`, so that a damaged or foreign cache never fails a call.
"""

from numba import njit

from . import _numba_cache


def arithmetic(func):
    """Compile ``func`` lazily in nopython mode, without the GIL, with caching; no explicit signature."""
    return _numba_cache.enable(njit(nogil=True)(func))



def arithmetic_inlined(func):
    """:func:`arithmetic` compiled into each of its callers (Numba's IR inlining, ``inline="always"``) instead of
    called: for a CPU step called in a hot loop whose call would pass hundreds of words through memory (the offset
    kernel's sub-tile, :func:`mmaemu.cpu.offset_kernel.subtile_block`: its operands and 21 vectors, twice per block;
    about 7% of the kernel's time, docs/performance.md)."""
    return _numba_cache.enable(njit(nogil=True, inline="always")(func))

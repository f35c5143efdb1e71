"""The one decorator of mmaemu's arithmetic: a plain Numba ``njit`` with on-disk caching.

Every arithmetic function is compiled from the same Python source for the CPU loops (:mod:`mmaemu.cpu`) and,
when called from a ``@cuda.jit`` kernel, for the GPU (:mod:`mmaemu.cuda`). The cache location is chosen by
:mod:`mmaemu._cache` (keyed by the package version and a hash of the arithmetic's sources).
"""

from numba import njit

from . import _cache

_cache.install()


def _compile(func, **options):
    try:
        return njit(cache=True, **options)(func)
    except RuntimeError:
        # No writable cache location anywhere: compile in memory rather than fail.
        return njit(**options)(func)


def arithmetic(func):
    """Compile ``func`` lazily in nopython mode with caching; no explicit signature."""
    return _compile(func)


def arithmetic_parallel(func):
    """A parallel CPU loop (``prange``) over arithmetic functions."""
    return _compile(func, parallel=True)

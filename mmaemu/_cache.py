"""Where compiled kernels are cached: ``$MMAEMU_CACHE_DIR/numba/<version>-<source hash>/``.

The directory is keyed by the package version and a hash of the sources of every module that Numba compiles
for us (:mod:`mmaemu.arith`, :mod:`mmaemu.cpu`), so a cache written by other code can never be loaded: a stale
cache cannot change a result. Numba additionally keys each entry by the function's source file contents.

``MMAEMU_CACHE_DIR`` moves the cache (default ``${XDG_CACHE_HOME:-~/.cache}/mmaemu``). When that location is
not writable the cache falls back to a per-user folder in the temporary directory, then to Numba's own
locations; if no location is writable the functions are compiled without caching. A call never fails
because of the cache.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile

from numba.core import caching

from ._version import __version__

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
_COMPILED_PACKAGES = ("arith", "cpu")
_COMPILED_MODULES = ("_jit.py", "_cache.py", "_version.py")


def default_cache_root() -> pathlib.Path:
    """``$MMAEMU_CACHE_DIR``, else ``${XDG_CACHE_HOME:-~/.cache}/mmaemu`` (read at call time)."""
    explicit = os.environ.get("MMAEMU_CACHE_DIR")
    if explicit:
        return pathlib.Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(xdg) / "mmaemu"


def source_hash() -> str:
    """sha256 (first 16 hex digits) of the sources Numba compiles for mmaemu, in a fixed order."""
    digest = hashlib.sha256(__version__.encode())
    files = [_PACKAGE_DIR / name for name in _COMPILED_MODULES]
    for package in _COMPILED_PACKAGES:
        files += sorted((_PACKAGE_DIR / package).glob("*.py"))
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_KEY = None


def cache_key() -> str:
    """``<version>-<source hash>``: the name of this build's numba cache folder."""
    global _KEY
    if _KEY is None:
        _KEY = f"{__version__}-{source_hash()}"
    return _KEY


def numba_cache_dir(root=None) -> pathlib.Path:
    return pathlib.Path(root or default_cache_root()) / "numba" / cache_key()


class _MmaemuCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """Numba cache locator for functions defined inside the mmaemu package."""

    roots = (default_cache_root, lambda: pathlib.Path(tempfile.gettempdir()) / f"mmaemu-{os.getuid()}")

    def __init__(self, py_func, py_file, root):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        sub = pathlib.Path(py_file).resolve().relative_to(_PACKAGE_DIR).with_suffix("")
        self._cache_path = str(numba_cache_dir(root) / sub)

    def get_cache_path(self):
        return self._cache_path

    @classmethod
    def from_function(cls, py_func, py_file):
        try:
            pathlib.Path(py_file).resolve().relative_to(_PACKAGE_DIR)
        except ValueError:
            return None
        for root in cls.roots:
            try:
                locator = cls(py_func, py_file, root())
                locator.ensure_cache_path()
                return locator
            except OSError:
                continue
        return None


def install():
    """Put our locator first for mmaemu functions; other functions keep Numba's locators."""
    classes = caching.CacheImpl._locator_classes
    if _MmaemuCacheLocator not in classes:
        classes.insert(0, _MmaemuCacheLocator)

"""Numba's on-disk cache for mmaemu's functions, made so that the cache can never fail a call.

Numba's own cache (``numba.core.caching``) unpickles whatever its index and data files hold: one truncated file
raises ``UnpicklingError`` from every later call, in every process. For mmaemu's functions only (Numba's caching of
other code is left as it is), :class:`MmaemuFunctionCache` changes three things:

* every index (``*.nbi``) and data (``*.nbc``) file starts with a magic line and the sha256 of its payload; a file
  whose digest does not match (truncated, overwritten, half-written by a crashed writer), that is not private (see
  :mod:`mmaemu.base._private`) or that cannot be read is ignored before anything is unpickled, with one
  :class:`~mmaemu.errors.CacheWarning` per process (naming the first such file); the function is compiled again
  and, where the cache is writable, the entry is replaced;
* any other failure while loading an entry (rebuilding the compiled code) is handled the same way, and a failure
  while saving one only costs the saving (one warning);
* the folders and files it writes are private (0700 and 0600), the locator is mmaemu's own
  (:func:`mmaemu.base._cache.numba_location`), and nothing is saved into a read-only cache.

Before the first function of a process is compiled into a cache that holds no compiled code of this build yet
(a new install, a new version, a new cache folder), one INFO record goes to the logger ``"mmaemu"``: what is
compiled, why, roughly how long it takes and that it happens once. The library never prints it; the command line
shows it (:mod:`mmaemu.cli`), and an application sees it with ``logging.basicConfig(level=logging.INFO)``.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import pathlib
import pickle
import sys

from numba.core import caching

from . import _cache, _private

MAGIC = b"mmaemu-numba-cache/1\n"
_DIGEST_BYTES = 32
LOGGER = logging.getLogger("mmaemu")
# What a cold cache costs: the first scaled_mm compiles the fast path of one preset, about 15 s on a quiet
# 2-core machine and a minute or more on a busy one (docs/performance.md, scripts/bench.py --cold-cache).
COLD_COMPILE_NOTE = ("mmaemu: compiling its arithmetic for this CPU (the compiled-code cache {folder} has none "
                     "of mmaemu {version} yet); this takes from about 15 s to a few minutes and happens once: "
                     "later calls and processes load it from the cache")
_first_miss_seen = False


def _note_first_miss(location) -> None:
    """At the first cache miss of the process: the INFO record of the module docstring if the cache is cold."""
    global _first_miss_seen
    if _first_miss_seen:
        return
    _first_miss_seen = True
    folder = location.numba_dir
    if folder is not None and folder.is_dir() and any(folder.rglob("*.nbi")):
        return  # a warm cache missing one function (a new schedule): a short compile, not worth a note
    from .._version import __version__

    LOGGER.info(COLD_COMPILE_NOTE.format(folder=folder, version=__version__))


class _Locator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """``<cache folder>/numba/<version>-<source hash>/<module path>/`` for a function of the mmaemu package."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._location = _cache.numba_location()
        sub = pathlib.Path(py_file).resolve().relative_to(_cache._PACKAGE_DIR).with_suffix("")
        self._cache_path = str(self._location.numba_dir / sub)

    def get_cache_path(self):
        return self._cache_path

    def ensure_cache_path(self):
        _private.make_private_folder(self._location.root, pathlib.Path(self._cache_path))

    @classmethod
    def from_function(cls, py_func, py_file):
        return cls(py_func, py_file)


class _CacheImpl(caching.CompileResultCacheImpl):
    """Numba's compile-result serialisation with mmaemu's locator only (no search through Numba's locators)."""

    def __init__(self, py_func):
        self._lineno = py_func.__code__.co_firstlineno
        self._locator = _Locator(py_func, inspect.getfile(py_func))
        modname = pathlib.Path(self._locator._py_file).stem
        self._filename_base = self.get_filename_base(f"{modname}.{py_func.__qualname__}",
                                                     getattr(sys, "abiflags", ""))


def _report(path, why: str) -> None:
    """One warning per process, for the first entry found unusable (the others are handled alike, silently)."""
    _cache.warn_once("entry", f"mmaemu ignores the compiled-code cache entry {path} ({why}); the function is "
                              f"compiled again (other unusable entries are handled alike without a warning)")


class _CheckedCacheFile(caching.IndexDataCacheFile):
    """Index and data files behind a magic line and a sha256 of the payload, written privately."""

    def load(self, key):
        data_name = self._load_index().get(key)
        return None if data_name is None else self._load_data(data_name)

    def _load_index(self):
        payload = self._read(self._index_path)
        if payload is None:
            return {}
        version, stamp, overloads = pickle.loads(payload)
        if version != self._version or stamp != self._source_stamp:
            return {}  # another Numba, or an edited source file: stale entries are overwritten in turn
        return overloads

    def _save_index(self, overloads):
        self._write(self._index_path, self._dump((self._version, self._source_stamp, overloads)))

    def _load_data(self, name):
        payload = self._read(self._data_path(name))
        return None if payload is None else pickle.loads(payload)

    def _save_data(self, name, data):
        self._write(self._data_path(name), self._dump(data))

    @staticmethod
    def _write(path, payload: bytes):
        _private.write_private_file(path, MAGIC + hashlib.sha256(payload).digest() + payload)

    @staticmethod
    def _read(path):
        """The payload of a cache file; None (with one warning) if it is missing, damaged or not private."""
        try:
            blob = _private.read_private_file(path)
        except OSError as exc:
            _report(path, str(exc))
            return None
        if blob is None:
            return None
        head, payload = blob[:len(MAGIC) + _DIGEST_BYTES], blob[len(MAGIC) + _DIGEST_BYTES:]
        if head != MAGIC + hashlib.sha256(payload).digest():
            _report(path, f"damaged: {len(blob)} bytes that do not match their checksum")
            return None
        return payload


class MmaemuFunctionCache(caching.FunctionCache):
    """Numba's per-function cache with the changes listed in the module docstring."""

    _impl_class = _CacheImpl

    def __init__(self, py_func):
        super().__init__(py_func)
        self._writable = self._impl.locator._location.writable
        self._cache_file = _CheckedCacheFile(self._cache_path, self._impl.filename_base,
                                             self._impl.locator.get_source_stamp())

    def load_overload(self, sig, target_context):
        try:
            loaded = super().load_overload(sig, target_context)
        except Exception as exc:  # a cache entry must never fail a call
            _report(self._cache_path, f"loading {self._name} failed: {type(exc).__name__}: {exc}")
            loaded = None
        if loaded is None:  # Numba compiles next
            _note_first_miss(self._impl.locator._location)
        return loaded

    def save_overload(self, sig, data):
        if not self._writable:
            return
        try:
            super().save_overload(sig, data)
        except Exception as exc:  # noqa: BLE001 - a failed save only costs the caching
            _cache.warn_once(("save", self._cache_path), f"mmaemu could not save compiled code in "
                                                         f"{self._cache_path} ({type(exc).__name__}: {exc})")


def enable(dispatcher):
    """Cache ``dispatcher`` (a Numba CPU dispatcher of an mmaemu function) on disk, where a usable folder exists."""
    if _cache.numba_location().root is None or not hasattr(dispatcher, "enable_caching"):
        return dispatcher
    dispatcher._cache = MmaemuFunctionCache(dispatcher.py_func)
    return dispatcher

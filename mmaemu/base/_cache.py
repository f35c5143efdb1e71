"""Where compiled kernels and self-test verdicts are cached, and why there.

The cache folder is ``$MMAEMU_CACHE_DIR`` when that is set, else the per-user cache folder of the platform
(``platformdirs.user_cache_dir("mmaemu")``: ``${XDG_CACHE_HOME:-~/.cache}/mmaemu`` on Linux). Compiled code lives in
``<folder>/numba/<version>-<source hash>/``, verdicts in ``<folder>/verdicts/``. The numba folder is keyed by the
package version and a hash of the sources of every module that Numba compiles for us (:mod:`mmaemu.arith`,
:mod:`mmaemu.cpu`), so a cache written by other code is never loaded: a stale cache cannot change a result.

The folder holds executable content (unpickling an entry runs code), so a folder is used only if it keeps the rules
of :mod:`mmaemu.base._private` (owned by the caller or root, not writable by group or others, nor replaceable through a
folder above it). A folder is

* ``read-write`` when it keeps the rules and the caller can write it (missing folders are created 0700);
* ``read-only`` when it keeps the rules, the caller cannot write it, and it already holds this build's compiled
  code: entries are loaded from it, nothing is saved;
* passed over otherwise (a regular file in its place, not writable and empty, refused by the rules).

A relative ``$MMAEMU_CACHE_DIR`` is passed over too (as the XDG base directory rules ignore relative paths: it
would name another folder in every working directory). If ``$MMAEMU_CACHE_DIR`` is passed over, the per-user folder is tried next (never a shared temporary folder); if
both are, nothing is cached and functions are compiled in every process. Each passed-over folder is reported once
per process with a :class:`~mmaemu.errors.CacheWarning`, and by ``python -m mmaemu info``. A call never fails
because of the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
from typing import Optional, Tuple

from . import _private
from .. import environment
from .._version import __version__
from ..warn import Notice, report

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent.parent  # mmaemu/, above base/
_COMPILED_PACKAGES = ("arith", "cpu")
_COMPILED_MODULES = ("base/_jit.py", "base/_cache.py", "base/_numba_cache.py", "base/_private.py",
                     "_version.py")
ENV = "MMAEMU_CACHE_DIR"


def user_cache_folder() -> pathlib.Path:
    """The platform's per-user cache folder for mmaemu (``platformdirs``; XDG rules on Linux)."""
    import platformdirs

    return pathlib.Path(platformdirs.user_cache_dir("mmaemu", appauthor=False))


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


def numba_cache_dir(root: pathlib.Path) -> pathlib.Path:
    """This build's compiled-code folder inside the cache folder ``root``."""
    return pathlib.Path(root) / "numba" / cache_key()


@dataclasses.dataclass(frozen=True)
class CacheLocation:
    """The cache folder this process uses: ``root`` (None: nothing is cached), ``state`` ("read-write",
    "read-only" or "disabled"), ``source`` (which setting named it), ``passed_over`` ((folder, why) of the
    folders tried before it)."""

    root: Optional[pathlib.Path]
    state: str
    source: str
    passed_over: Tuple[Tuple[str, str], ...] = ()

    @property
    def writable(self) -> bool:
        return self.state == "read-write"

    @property
    def numba_dir(self) -> Optional[pathlib.Path]:
        return None if self.root is None else numba_cache_dir(self.root)

    def subfolder(self, name: str) -> Optional[pathlib.Path]:
        """``root/name`` if it keeps the rules of :mod:`mmaemu.base._private` (it may not exist yet), else None."""
        if self.root is None:
            return None
        folder = self.root / name
        return None if _private.tree_problem(self.root, folder) else folder


def _candidates(env: environment.Snapshot):
    explicit = env[ENV]
    if explicit:
        yield pathlib.Path(explicit), ENV
    yield user_cache_folder(), "the per-user cache folder"


def _assess(path: pathlib.Path) -> Tuple[Optional[str], str]:
    """(state or None, why) of a candidate folder (absolute, without symbolic links)."""
    if path.exists() and not path.is_dir():
        return None, f"{path} is not a directory"
    problem = _private.ancestors_problem(path) or _private.tree_problem(path, numba_cache_dir(path))
    if problem:
        return None, f"refused: {problem}"
    existing = next(p for p in (numba_cache_dir(path), path, *path.parents) if p.exists())
    if os.access(existing, os.W_OK | os.X_OK):
        return "read-write", "writable"
    if existing == numba_cache_dir(path):
        return "read-only", "not writable, holds this build's compiled code"
    if existing == path:
        return None, f"{path} is not writable and holds no compiled code of this build"
    return None, f"{path} does not exist and {existing} is not writable"


def cache_location() -> CacheLocation:
    """The folder used now (see the module docstring); never raises."""
    env = environment.snapshot()
    passed_over = []
    if ENV in env.invalid:  # a relative path: not even inspected
        passed_over.append((env.raw[ENV], f"{ENV}: {env.invalid[ENV]}"))
    for path, source in _candidates(env):
        try:
            resolved = pathlib.Path(os.path.realpath(path))
            state, why = _assess(resolved)
        except OSError as exc:
            state, why = None, f"cannot be inspected: {exc}"
        if state:
            return CacheLocation(resolved, state, source, tuple(passed_over))
        passed_over.append((str(path), f"{source}: {why}"))
    return CacheLocation(None, "disabled", "no usable folder", tuple(passed_over))


_NUMBA_LOCATION = None


def numba_location() -> CacheLocation:
    """The folder of this process's compiled code: :func:`cache_location` at the first compilation, kept for the
    life of the process (every function of one build is cached in one place). Warns once per folder passed
    over."""
    global _NUMBA_LOCATION
    if _NUMBA_LOCATION is None:
        location = cache_location()
        for folder, why in location.passed_over:
            where = f"cached in {location.root}" if location.root else "not cached (compiled in every process)"
            warn_once(("passed over", folder), f"mmaemu does not use the cache folder {folder} ({why}); "
                                               f"compiled code is {where}")
        _NUMBA_LOCATION = location
    return _NUMBA_LOCATION


def warn_once(key, message: str) -> None:
    """Report a CacheWarning, once per process per ``key`` (:mod:`mmaemu.warn`)."""
    from ..errors import CacheWarning

    report([Notice(CacheWarning, message, (key,))])

"""mmaemu's warnings: decisions return them as data, one registry keeps them once per process, the user's line
gets them.

A decision does not call ``warnings.warn``: it returns :class:`Notice` records (class, text, once-key) with its
result, and hands them on with :func:`report`. What happens to them depends on the context the call runs in:

* inside :func:`collecting` (``explain``, or a caller that wants the texts): they are appended to the collector's
  list; nothing is emitted and no once-slot is used, so a later live call still warns;
* inside :func:`edge` (the public entry points: ``scaled_mm``, ``accumulate``, a ``patch`` block's calls): they are
  held until the entry point returns or raises, then emitted in the order they were reported;
* otherwise (a layer called directly, e.g. ``resolve_splitk`` or ``backends.select``) they are emitted at once.

Emitting a notice with a once-key claims its slot in the one registry of this module (keyed by the class and the
once-key): a second notice with the same key is dropped for the rest of the process; a notice without a key is
emitted every time. The warning is attributed to the first frame outside mmaemu, torch, numba, contextlib and
the import machinery: the user's line, however deep the layers are. :func:`reset` forgets the registry (tests).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
import warnings
from typing import Iterable, List, NamedTuple, Optional

__all__ = ["Notice", "report", "collecting", "edge", "user_stacklevel", "reset"]


class Notice(NamedTuple):
    """A warning as data: ``category`` (a Warning class), ``message`` (its text) and ``once_key`` (a hashable key:
    emitted once per process per (category, key); None: every time). ``repeat``: emitted every time although it
    claims its key's slot (a deprecated alias warns at each use and stands for the name it replaces)."""

    category: type
    message: str
    once_key: Optional[tuple] = None
    repeat: bool = False


_lock = threading.Lock()
_emitted = set()
# The innermost open context: ("collect" | "edge", list of notices), or None.
_context: contextvars.ContextVar = contextvars.ContextVar("mmaemu_warnings", default=None)


def report(notices: Iterable[Notice]) -> None:
    """Hand ``notices`` to the innermost context (see the module docstring); emit them now if none is open."""
    notices = list(notices)
    if not notices:
        return
    context = _context.get()
    if context is None:
        _emit(notices)
    else:
        context[1].extend(notices)


@contextlib.contextmanager
def collecting():
    """Within the block, reported notices are appended to the list it yields: none is emitted, no slot used."""
    collected: List[Notice] = []
    token = _context.set(("collect", collected))
    try:
        yield collected
    finally:
        _context.reset(token)


class edge:
    """An entry point's block: the notices reported inside it are emitted when it ends (returns or raises), once
    per key, at the user's line. Inside another open context (an outer entry point, :func:`collecting`) it adds
    nothing: the outer context decides."""

    def __enter__(self):
        self._token = None
        if _context.get() is None:
            self._held: List[Notice] = []
            self._token = _context.set(("edge", self._held))
        return self

    def __exit__(self, *exc_info):
        if self._token is not None:
            _context.reset(self._token)
            _emit(self._held)
        return False


def _emit(notices: List[Notice]) -> None:
    for notice in notices:
        first = notice.once_key is None or _claim((notice.category, notice.once_key))
        if not (first or notice.repeat):
            continue
        warnings.warn(notice.message, notice.category, stacklevel=user_stacklevel())


def _claim(key) -> bool:
    with _lock:
        first = key not in _emitted
        _emitted.add(key)
    return first


def reset() -> None:
    """Forget which once-per-process warnings were emitted (tests only)."""
    with _lock:
        _emitted.clear()


# ----------------------------------------------------------------------------------------------------------------
# The user's frame


def _library_prefixes() -> tuple:
    """Folders whose frames are not the user's: mmaemu, and torch / numba when they are loaded."""
    prefixes = [os.path.dirname(os.path.abspath(__file__)) + os.sep, os.path.abspath(contextlib.__file__)]
    for name in ("torch", "numba"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            prefixes.append(os.path.dirname(os.path.abspath(module.__file__)) + os.sep)
    return tuple(prefixes)


def _is_library(filename: str, prefixes: tuple) -> bool:
    return filename.startswith("<frozen importlib") or os.path.abspath(filename).startswith(prefixes)


def user_stacklevel() -> int:
    """The ``warnings.warn`` stacklevel, counted from the function calling this one, of the first frame outside
    the libraries (:func:`_library_prefixes`); the outermost frame if every frame is theirs."""
    prefixes = _library_prefixes()
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and _is_library(frame.f_code.co_filename, prefixes):
        frame, level = frame.f_back, level + 1
    return level

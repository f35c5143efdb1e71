"""Private folders and files: the only places mmaemu loads compiled code and self-test verdicts from.

Loading a compiled-code cache entry unpickles it, i.e. runs code, so a folder that another user can write is a way
to run code as the caller. The rules (POSIX; those of OpenSSH's ``StrictModes``), checked before anything is
read:

* the cache folder and every folder and file below it: owned by the caller or by root, not writable by group or
  others, no symbolic links below the cache folder (the folder itself is resolved first, once);
* every folder above it: owned by the caller or by root, and not writable by group or others unless it carries
  the sticky bit (``/tmp``: there only a name's owner may rename or delete it);
* what mmaemu creates is private: folders 0700 (like ``XDG_CACHE_HOME`` asks), files 0600, written whole under a
  temporary name and renamed into place.

Root may own them because root can replace the interpreter anyway; a cache prepared by root (a container image)
and made readable to others is loaded read-only. On Windows, where files have no POSIX owner or mode bits, the
rules are not checked: the per-user cache folder (``%LOCALAPPDATA%``) is private through its ACLs.
"""

from __future__ import annotations

import os
import pathlib
import stat
import uuid
from typing import Optional

CHECKED = os.name == "posix"
FOLDER_MODE = 0o700
FILE_MODE = 0o600


class UnsafePath(OSError):
    """A folder or file that breaks the rules above (the message says which rule)."""


def trusted_owners():
    return {os.getuid(), 0} if CHECKED else set()


def _owner_problem(st, path) -> Optional[str]:
    if st.st_uid not in trusted_owners():
        return f"{path} is owned by uid {st.st_uid}, neither the caller (uid {os.getuid()}) nor root"
    return None


def entry_problem(path, st, kind: str = "folder") -> Optional[str]:
    """Why a folder or file inside the cache breaks the rules (None if it keeps them). ``st``: its lstat."""
    if not CHECKED:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    is_kind = stat.S_ISDIR if kind == "folder" else stat.S_ISREG
    if not is_kind(st.st_mode):
        return f"{path} is not a {'directory' if kind == 'folder' else 'regular file'}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by {_writers(st.st_mode)} (mode {stat.S_IMODE(st.st_mode):04o})"
    return _owner_problem(st, path)


def ancestors_problem(path: pathlib.Path) -> Optional[str]:
    """Why a folder above ``path`` (an absolute path without symbolic links) lets another user replace it."""
    if not CHECKED:
        return None
    for parent in reversed(path.parents):
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            return None  # the rest will be created by the caller, privately
        problem = _owner_problem(st, parent)
        if problem:
            return problem
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return f"{parent} is writable by {_writers(st.st_mode)} without the sticky bit"
    return None


def _writers(mode: int) -> str:
    return " and ".join(w for bit, w in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "others")) if mode & bit)


def _chain(root: pathlib.Path, folder: pathlib.Path):
    """``root``, then every folder below it down to ``folder``."""
    parts = folder.relative_to(root).parts
    return [root] + [root.joinpath(*parts[:i]) for i in range(1, len(parts) + 1)]


def tree_problem(root: pathlib.Path, folder: pathlib.Path) -> Optional[str]:
    """Why ``root`` or an existing folder between it and ``folder`` (inside root) breaks the rules."""
    for path in _chain(root, folder):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        problem = entry_problem(path, st)
        if problem:
            return problem
    return None


def make_private_folder(root: pathlib.Path, folder: pathlib.Path) -> None:
    """Create ``folder`` (inside ``root``) and whatever is missing above it with mode 0700; raise UnsafePath if an
    existing folder on the way breaks the rules."""
    problem = ancestors_problem(root)
    if problem:
        raise UnsafePath(problem)
    for parent in reversed(root.parents):
        if not os.path.isdir(parent):
            os.mkdir(parent, FOLDER_MODE)
    for path in _chain(root, folder):
        try:
            os.mkdir(path, FOLDER_MODE)
        except FileExistsError:
            pass
        problem = entry_problem(path, os.lstat(path))
        if problem:
            raise UnsafePath(problem)


def read_private_file(path) -> Optional[bytes]:
    """The bytes of a file inside the cache, or None if it does not exist; UnsafePath if it breaks the rules."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        problem = entry_problem(path, os.fstat(handle.fileno()), kind="file")
        if problem:
            raise UnsafePath(problem)
        return handle.read()


def write_private_file(path, data: bytes) -> None:
    """Write ``data`` to ``path`` (mode 0600) under a temporary name, then rename it into place."""
    tmp = f"{path}.tmp.{uuid.uuid4().hex[:16]}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        with os.fdopen(os.open(tmp, flags, FILE_MODE), "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

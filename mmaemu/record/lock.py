"""One recorder per bundle: an exclusive lock on ``<out>/<name>.lock`` held for the whole recording.

Two recorders appending to one ``<name>.partial/answers.bin`` (two GPUs of one node, same default name) would
interleave their rows into a table that looks complete. The lock is ``fcntl.flock`` on a lock file next to the
partial recording; it is released by the kernel when the process ends, however it ends, so a crashed recorder
never leaves a stale lock. The file holds the PID of the recorder that holds it, for the refusal message. It is
removed when the recording ends; a recorder that locked a file another one removed meanwhile locks the new one.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .machine import RecordError

__all__ = ["recording_lock", "lock_path"]


def lock_path(out_dir: Path, name: str) -> Path:
    return Path(out_dir) / f"{name}.lock"


@contextlib.contextmanager
def recording_lock(out_dir: Path, name: str):
    """Hold the exclusive lock of bundle ``name`` in ``out_dir`` (RecordError naming the holder's PID when another
    recorder holds it)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no flock; one recorder per folder is then the user's to ensure
        yield None
        return
    path = lock_path(out_dir, name)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0),
                     0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            os.close(fd)
            raise RecordError(f"another recorder ({holder}) is recording {name!r} into {Path(out_dir)}: wait for it "
                              f"to finish, or record with another --name or --out (lock {path})") from None
        if _same_file(fd, path):
            break
        os.close(fd)  # the holder removed the file after we opened it: lock the one now at the path
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"PID {text}" if text.isdigit() else "PID unknown"


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)

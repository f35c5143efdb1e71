"""A progress line for long recordings: done/total, rate and time left (stderr; nothing with quiet=True).

On a terminal the line is redrawn in place at most five times a second; in a log (not a terminal) a line is
written every 30 seconds, so that a long recording leaves a readable trace.
"""

from __future__ import annotations

import sys
import time

__all__ = ["Progress", "duration_text"]


def duration_text(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """``update(done, work)``: ``done`` of ``total`` items finished, ``work`` the units of work so far (queries)
    for the rate. ``log(text)`` prints a line (unless quiet) without breaking the bar."""

    def __init__(self, total: int, label: str, unit: str, *, quiet: bool = False, stream=None, start_done: int = 0):
        self.total, self.label, self.unit, self.quiet = total, label, unit, quiet
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start, self.start_done = time.monotonic(), start_done
        self._last_draw, self._drawn = 0.0, False

    def update(self, done: int, work: int, *, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < (0.2 if self.tty else 30.0):
            return
        self._last_draw = now
        elapsed = max(now - self.start, 1e-9)
        rate = (done - self.start_done) / elapsed
        left = (self.total - done) / rate if rate > 0 else float("inf")
        width = 24
        filled = int(width * done / self.total) if self.total else width
        text = (f"{self.label} {100.0 * done / max(self.total, 1):5.1f}% |{'#' * filled}{' ' * (width - filled)}| "
                f"{done:,}/{self.total:,}, {work / elapsed:,.0f} {self.unit}/s, "
                f"{duration_text(left) if left != float('inf') else '?'} left")
        self._write(text)

    def log(self, text: str) -> None:
        if not self.quiet:
            self._write(text, final=True)

    def close(self) -> None:
        if self._drawn and self.tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()
        self._drawn = False

    def _write(self, text: str, final: bool = False) -> None:
        if self.tty and not final:
            self.stream.write("\r" + text.ljust(100)[:160])
            self._drawn = True
        else:
            if self._drawn and self.tty:
                self.stream.write("\n")
                self._drawn = False
            self.stream.write(text + "\n")
        self.stream.flush()

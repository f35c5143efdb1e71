"""The CPU backend: parallel Numba loops over the arithmetic of :mod:`mmaemu.arith`.

:func:`accumulate_codes` runs the fast tile path (:mod:`mmaemu.arith.tile`) by default and the straightforward
per-output loop (``accumulate_one``) with ``reference=True``; both give the same bits. Importing this package
selects Numba's ``workqueue`` threading layer unless the user chose one (see :mod:`mmaemu.cpu.threads` and
docs/performance.md).
"""

from .engine import accumulate_codes, epilogue_codes

__all__ = ["accumulate_codes", "epilogue_codes"]

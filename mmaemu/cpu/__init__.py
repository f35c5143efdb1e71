"""The CPU backend: compiled loops over the arithmetic of :mod:`mmaemu.arith`, run in parallel on mmaemu's own
threads.

:func:`accumulate_codes` runs the fast tile path (:mod:`mmaemu.arith.tile`) by default and the straightforward
per-output loop (``accumulate_one``) with ``reference=True``; both give the same bits. :func:`accumulate_block_scaled`
does the same for the block-scaled (MXFP8 / NVFP4) instructions, one chain per output. Numba's threading layer is
neither used nor changed (see :mod:`mmaemu.cpu.threads` and docs/performance.md).
"""

from .block_scaled import accumulate_block_scaled
from .engine import accumulate_codes, epilogue_codes, rowwise_epilogue_codes

__all__ = ["accumulate_codes", "accumulate_block_scaled", "epilogue_codes", "rowwise_epilogue_codes"]

"""The CPU backend: compiled loops over the arithmetic of :mod:`mmaemu.arith`, run in parallel on mmaemu's own
threads.

:func:`accumulate_codes` runs a fast engine by default and the straightforward per-output loop (``accumulate_one``)
with ``reference=True``; all give the same bits. The fast engine is the offset engine (:mod:`.offset_engine`:
:mod:`mmaemu.arith.offset` on AVX-512 vectors, or AVX2 ones rounding by MXCSR) where the CPU Numba compiles for has
AVX-512, or AVX2 and FMA, and the call fits the method, the tile engine (:mod:`mmaemu.arith.tile`) elsewhere (:mod:`.features`, ``MMAEMU_CPU_ENGINE``).
:func:`accumulate_block_scaled` does the same for the block-scaled (MXFP8 / NVFP4) instructions, one chain per
output. Numba's threading layer is
neither used nor changed (see :mod:`mmaemu.cpu.threads` and docs/performance.md).
"""

from .block_scaled import accumulate_block_scaled
from .engine import accumulate_codes, epilogue_codes, rowwise_epilogue_codes

__all__ = ["accumulate_codes", "accumulate_block_scaled", "epilogue_codes", "rowwise_epilogue_codes"]

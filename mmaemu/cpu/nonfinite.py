"""Which rows of an operand hold a NaN or Inf code (semantics.md c.4 decides their outputs), per format."""

from __future__ import annotations

import numpy as np

from . import threads
from .gemm import nonfinite_rows

# NaN and Inf codes are exactly the codes with ``code & mask == pattern`` (E4M3: S.1111.111; E5M2: S.11111.xx).
NONFINITE_PATTERN = {"e4m3": (0x7F, 0x7F), "e5m2": (0x7C, 0x7C)}


def nonfinite_flags(codes, fmt: str):
    """Per row of ``codes``: True if it holds a NaN or Inf code (formats.nonfinite_mask(...).any(axis=1))."""
    flags = np.empty(codes.shape[0], np.bool_)
    threads.parallel_for(nonfinite_rows, codes.shape[0], max(1, codes.shape[1]), codes, *NONFINITE_PATTERN[fmt],
                         flags)
    return flags

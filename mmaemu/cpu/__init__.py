"""The CPU backend: parallel Numba loops over the arithmetic of :mod:`mmaemu.arith`."""

from .engine import accumulate_codes, epilogue_codes

__all__ = ["accumulate_codes", "epilogue_codes"]

"""The CUDA backend: Numba CUDA kernels over the arithmetic of :mod:`mmaemu.arith` (platform.md section 4, our own
kernels).

The package reads in four layers, each importing only those before it:

* device and gating - :mod:`.catalog` (the kernels as metadata), :mod:`.device` (which GPU, can the kernels run
  there), :mod:`.gating` (self-test verdicts, the choice of a kernel, dispatch of a call);
* kernels - :mod:`.shim` (how kernels call the ``@njit`` arithmetic), :mod:`.kernels` and the other kernel modules
  (``@cuda.jit`` shells around :mod:`mmaemu.arith`; no arithmetic of their own);
* launch - :mod:`.launch` (grids, work arrays, declines), :mod:`.engine` (torch and numpy in and out);
* self-test - :mod:`.selftest` (the cases a kernel must pass on a device), :mod:`.offline` (PTX without a GPU).

Importing this package imports neither numba.cuda nor torch and initialises no CUDA.
"""

from .catalog import KERNELS
from .gating import (FORCE_FAIL_ENV, accumulate, design_skip, ensure_verdict, epilogue, reset, rowwise_epilogue,
                     run_selftests, schedule_skip, select, status)

__all__ = ["KERNELS", "select", "accumulate", "epilogue", "rowwise_epilogue", "status", "run_selftests", "ensure_verdict",
           "design_skip", "schedule_skip", "reset", "FORCE_FAIL_ENV"]

"""The CUDA backend: Numba CUDA kernels over the arithmetic of :mod:`mmaemu.arith` (platform.md section 4, our own
kernels).

The package is grouped by kind:

* metadata and device - :mod:`.catalog` (the kernels as metadata), :mod:`.device` (which GPU, can the kernels run
  there), :mod:`.shim` (how kernels call the ``@njit`` arithmetic);
* kernels - ``@cuda.jit`` shells around :mod:`mmaemu.arith` (no arithmetic of their own), each beside its decline
  rule: :mod:`.simple` (the GPU reference and the kernels all share: NaN/Inf rule, epilogues), :mod:`.offset`,
  :mod:`.native` (the tensor-core instructions and their wrappers), :mod:`.blockwise` (chunked kernels),
  :mod:`.block_scaled` (MXFP8/NVFP4);
* verdicts - :mod:`.verdicts` (the instruction probe and the self-tests a kernel must pass on a device);
* dispatch - :mod:`.dispatch` (the choice of a kernel and the fallback of a call, launches, torch and numpy in and
  out).

Offline PTX and SASS (developer tooling, no GPU) live outside the package, in the repository's ``tools/``.

Importing this package imports neither numba.cuda nor torch and initialises no CUDA.
"""

from .catalog import KERNELS
from .dispatch.gating import (FORCE_FAIL_ENV, accumulate, default_choice, design_skip, ensure_verdict, epilogue,
                              reset, rowwise_epilogue, run_selftests, schedule_skip, select, status, verdicts_of)

__all__ = ["KERNELS", "select", "accumulate", "epilogue", "rowwise_epilogue", "status", "run_selftests",
           "ensure_verdict", "verdicts_of", "default_choice", "design_skip", "schedule_skip", "reset", "FORCE_FAIL_ENV"]

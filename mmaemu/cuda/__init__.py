"""The CUDA backend: Numba CUDA kernels over the arithmetic of :mod:`mmaemu.arith` (platform.md section 4, our own
kernels).

The package is grouped by kind:

* registry and device - :mod:`.catalog` (the kernel registry: every kernel as one entry, with its recipes,
  priority, decline rules, self-test cases and launch), :mod:`.device` (which GPU, can the kernels run there: its
  :class:`mmaemu.base.device_facts.DeviceFacts`), :mod:`.shim` (how kernels call the ``@njit`` arithmetic);
* kernels - ``@cuda.jit`` shells around :mod:`mmaemu.arith` (no arithmetic of their own), each beside its decline
  rule: :mod:`.simple` (the GPU reference and the kernels all share: NaN/Inf rule, epilogues), :mod:`.offset`,
  :mod:`.native` (the tensor-core instructions and their wrappers), :mod:`.blockwise` (chunked kernels),
  :mod:`.block_scaled` (MXFP8/NVFP4);
* verdicts - :mod:`.verdicts` (the instruction probe, the self-tests a kernel must pass on a device and the
  verdict store, :mod:`.verdicts.store`);
* dispatch - :mod:`.dispatch` (the one choice of a kernel and the fallback of a call, decline rules, launches,
  torch and numpy in and out).

Offline PTX and SASS (developer tooling, no GPU) live outside the package, in the repository's ``tools/``.

Importing this package imports neither numba.cuda nor torch and initialises no CUDA.
"""

from .catalog import KERNELS, REGISTRY, candidates
from .dispatch.declines import design_skip, schedule_skip
from .dispatch.gating import (accumulate, default_choice, device_context, epilogue, recipe_kernel, reset,
                              rowwise_epilogue, run_selftests, select, status)
from .verdicts.store import FORCE_FAIL_ENV, ensure_verdict, verdicts_of

__all__ = ["KERNELS", "REGISTRY", "candidates", "select", "accumulate", "epilogue", "rowwise_epilogue", "status",
           "run_selftests", "ensure_verdict", "verdicts_of", "default_choice", "device_context", "recipe_kernel",
           "design_skip", "schedule_skip", "reset", "FORCE_FAIL_ENV"]

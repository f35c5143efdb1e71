"""PTX of mmaemu's kernels without a GPU (the CI check of ``tests/test_cuda_sim.py``, ``scripts/sass_report.py``).

Numba compiles the device functions a kernel calls "for the current device" (``get_current_device()`` in
numba.cuda's dispatcher), so the public ``cuda.compile_ptx`` needs a driver. :func:`compile_ptx` replaces that
lookup by a fake device of the requested capability and sets ``FORCE_CUDA_CC`` to the exact target. Both are
process-wide changes to numba: call it only in a process made for it (a test worker, a script), never next to
kernels that run on a real device.
"""

from __future__ import annotations


class _FakeDevice:
    compute_capability = (9, 0)


def compile_ptx(kernel, signature, cc):
    """PTX text of a ``@cuda.jit`` kernel for argument types ``signature`` and compute capability ``cc``."""
    import numba.cuda.dispatcher as cuda_dispatcher
    from numba import cuda

    try:
        from numba.cuda import config as cuda_config
    except ImportError:  # pragma: no cover - numba's built-in target keeps it in numba.core
        from numba.core import config as cuda_config
    _FakeDevice.compute_capability = tuple(cc)
    cuda_dispatcher.get_current_device = lambda: _FakeDevice
    cuda_config.FORCE_CUDA_CC = tuple(cc)  # the exact target, not the closest one numba's tables know
    return cuda.compile_ptx(kernel.py_func, signature, cc=tuple(cc))[0]

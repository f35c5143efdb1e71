"""PTX of mmaemu's kernels without a GPU (the CI checks of ``tests/test_cuda_sim.py`` and
``tests/test_native_sim.py``, ``scripts/sass_report.py``).

Numba compiles the device functions a kernel calls "for the current device" (``get_current_device()`` in
numba.cuda's dispatcher), so the public ``cuda.compile_ptx`` needs a driver. :func:`compile_ptx` replaces that
lookup by a fake device of the requested capability and sets ``FORCE_CUDA_CC`` to the exact target. Both are
process-wide changes to numba: call it only in a process made for it (a test worker, a script), never next to
kernels that run on a real device.

Architecture-specific targets (``sm_90a``, for ``cuda:native``'s warpgroup MMA): numba-cuda compiles for them
directly. Numba's built-in target knows no suffixes, so :func:`compile_ptx` compiles for the base capability and
names the suffixed target in the module's ``.target`` line (:func:`suffixed_target`). That gives the same code:
NVVM generates the same PTX for sm_90 and sm_90a (the suffix lets ptxas accept the architecture-specific
instructions; mmaemu emits those as inline assembly, which NVVM passes through as text). Checked with numba
0.68.1's built-in target against numba-cuda 0.30.4 (libNVVM and ptxas of CUDA 13.0): the PTX of a native kernel
differed only in its symbol names, the ``.target`` line and seven unused globals of the built-in target's error
reporting, and the SASS of all 12 sm_90a kernels was the same instruction for instruction; the SASS check of
tests/test_native_sim.py repeats the comparison wherever numba-cuda is installed.
"""

from __future__ import annotations

import re


class _FakeDevice:
    compute_capability = (9, 0)


def suffixed_target(ptx: str, suffix: str) -> str:
    """``ptx`` with its ``.target sm_XY`` line naming ``sm_XY<suffix>`` (e.g. ``"a"``: sm_90 -> sm_90a)."""
    text, count = re.subn(r"^(\.target sm_\d+)\b", rf"\g<1>{suffix}", ptx, count=1, flags=re.M)
    if not count:
        raise ValueError("no .target line in the PTX module")
    return text


def compile_ptx(kernel, signature, cc):
    """PTX text of a ``@cuda.jit`` kernel for argument types ``signature`` and compute capability ``cc``
    (``(major, minor)``, or ``(major, minor, suffix)`` for an architecture-specific target such as sm_90a)."""
    import numba.cuda.dispatcher as cuda_dispatcher
    from numba import cuda

    from mmaemu.cuda.shim import cuda_implementation

    try:
        from numba.cuda import config as cuda_config
    except ImportError:  # pragma: no cover - numba's built-in target keeps it in numba.core
        from numba.core import config as cuda_config
    cc = tuple(cc)
    suffix = cc[2] if len(cc) > 2 and cuda_implementation() != "numba-cuda" else None
    if suffix:
        cc = cc[:2]
    _FakeDevice.compute_capability = cc
    cuda_dispatcher.get_current_device = lambda: _FakeDevice
    cuda_config.FORCE_CUDA_CC = cc  # the exact target, not the closest one numba's tables know
    ptx = cuda.compile_ptx(kernel.py_func, signature, cc=cc)[0]
    return suffixed_target(ptx, suffix) if suffix else ptx

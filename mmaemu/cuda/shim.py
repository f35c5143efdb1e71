"""How the CUDA kernels call the arithmetic of :mod:`mmaemu.arith` (the same functions the CPU loops run).

* On a real device the kernels call the ``@njit`` dispatchers of :mod:`mmaemu.arith` directly: Numba's CUDA
  target recompiles a CPU dispatcher that a kernel calls as a device function, from the same Python source,
  without fast-math (IEEE adds, no flush-to-zero; the PTX check of ``tests/test_cuda_sim.py`` also finds no
  fused multiply-add in any kernel).
* Under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) a kernel is plain Python and its arrays are
  ``FakeWithinKernelCUDAArray`` objects, which an ``@njit`` function cannot accept: :func:`device` then wraps the
  dispatcher so that such arrays are unwrapped to the numpy arrays they hold before the (CPU-compiled) call.
* Numba's *built-in* CUDA target (``numba.cuda`` of numba >= 0.61 without the numba-cuda package) cannot compile
  ``min``/``max`` of numbers: numba implements them with a star-argument ``@overload`` that this target's
  dispatcher does not fold. :func:`install_builtin_minmax` registers, for the CUDA target only, a typing
  template and a lowering of ``min``/``max`` over two or more numbers built on numba's own ``do_minmax`` (Python's
  left-to-right rule). numba-cuda needs no such help and is left alone.
* :func:`install_fma_toward_zero` makes :func:`mmaemu.arith.fp32.fma_toward_zero` the GPU's ``fma.rz.f32`` in
  kernels (its float64 emulation elsewhere): the same IEEE operation, one instruction instead of a dozen.
"""

from __future__ import annotations

import functools
import operator

_MINMAX_INSTALLED = False


def simulator_enabled() -> bool:
    """``NUMBA_ENABLE_CUDASIM`` was on when numba was imported."""
    from numba.core import config

    return bool(getattr(config, "ENABLE_CUDASIM", False))


def cuda_implementation() -> str:
    """``"numba-cuda"`` (NVIDIA's package), ``"built-in"`` (numba's own target) or ``"simulator"``."""
    if simulator_enabled():
        return "simulator"
    from numba import cuda

    return "built-in" if getattr(cuda, "implementation", "") == "Built-in" else "numba-cuda"


def _unwrap(value):
    """The numpy array behind a simulator array (inside or outside a kernel), also inside tuples; anything else
    unchanged (a named tuple stays one: the arithmetic reads its fields by name)."""
    if isinstance(value, tuple):
        items = [_unwrap(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    name = type(value).__name__
    if name == "FakeWithinKernelCUDAArray":
        value = value._item
        name = type(value).__name__
    if name == "FakeCUDAArray":
        return value._ary
    return value


def device(dispatcher):
    """The callable a kernel uses for an arithmetic function: the dispatcher itself, or the simulator wrapper."""
    if not simulator_enabled():
        return dispatcher

    @functools.wraps(dispatcher.py_func)
    def call(*args):
        return dispatcher(*[_unwrap(arg) for arg in args])

    return call


def devices(module, *names) -> tuple:
    """:func:`device` of each function ``names`` of ``module`` (an :mod:`mmaemu.arith` module), in that order."""
    return tuple(device(getattr(module, name)) for name in names)


def register_cap(registers: int) -> dict:
    """``cuda.jit`` options that cap a kernel's registers per thread (none under the simulator, which has no
    registers and rejects the option)."""
    return {} if simulator_enabled() else {"max_registers": registers}


def install_builtin_minmax():
    """Make ``min``/``max`` of numbers compile with numba's built-in CUDA target (no-op elsewhere)."""
    global _MINMAX_INSTALLED
    if _MINMAX_INSTALLED or cuda_implementation() != "built-in":
        return
    from numba.core import types
    from numba.core.typing.templates import AbstractTemplate, signature
    from numba.cpython.builtins import do_minmax
    from numba.cuda.cudadecl import registry as typing_registry
    from numba.cuda.cudaimpl import registry as impl_registry

    numbers = (types.Integer, types.Float, types.Boolean)

    class _MinMaxOfNumbers(AbstractTemplate):
        # Templates of the "cuda" target are tried before numba's generic star-argument overload.
        metadata = {"target": "cuda"}

        def generic(self, args, kws):
            if kws or len(args) < 2 or not all(isinstance(arg, numbers) for arg in args):
                return None
            unified = self.context.unify_types(*args)
            return None if unified is None else signature(unified, *args)

    for function, compare in ((min, operator.lt), (max, operator.gt)):
        template = type(f"CudaBuiltin_{function.__name__}", (_MinMaxOfNumbers,), {"key": function})
        typing_registry.register_global(function)(template)

        def lower(context, builder, sig, args, compare=compare):
            result = do_minmax(context, builder, list(sig.args), list(args), compare)
            unified = context.typing_context.unify_types(*sig.args)
            return context.cast(builder, result, unified, sig.return_type)

        impl_registry.lower(function, types.VarArg(types.Any))(lower)
    _MINMAX_INSTALLED = True


def restore_numpy_row_stack():
    """Give NumPy >= 2.5 back its ``row_stack`` alias of ``vstack`` if it lacks it.

    numba-cuda releases up to at least 0.30 register an overload for ``np.row_stack`` unconditionally when their
    array support is imported (while the first kernel compiles), and NumPy 2.5 removed that alias, so every
    kernel failed to compile with "module 'numpy' has no attribute 'row_stack'" (seen on an H200 image with
    NumPy 2.5.2). The alias is exactly what NumPy < 2.5 had; nothing else changes.
    """
    import numpy as np

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack


_FMA_INSTALLED = False


def overload_fp32_fma(function, libdevice_name):
    """Register a ``target="cuda"`` overload of the arithmetic's emulated fused multiply-add ``function`` that, on
    three float32 arguments, is the GPU's own instruction ``libdevice.<libdevice_name>`` (e.g. ``fmaf_rz``).

    numba prefers a ``target="cuda"`` overload to the generic function in kernels (its built-in CUDA target and
    numba-cuda alike); other argument types keep the emulation. The caller checks that both round alike.
    """
    from numba.core import types
    from numba.core.extending import overload

    @overload(function, target="cuda")
    def _fma_cuda(a, b, c):
        if (a, b, c) != (types.float32,) * 3:
            return None
        from numba.cuda import libdevice

        instruction = getattr(libdevice, libdevice_name)

        def impl(a, b, c):
            return instruction(a, b, c)

        return impl


def install_fma_toward_zero():
    """Compile :func:`mmaemu.arith.fp32.fma_toward_zero` to the GPU's own fused multiply-add rounding toward zero
    (libdevice ``__nv_fmaf_rz``, PTX ``fma.rz.f32``) in CUDA kernels, instead of its float64 emulation.

    Both are IEEE ``fusedMultiplyAdd`` with roundTowardZero, so the bits are the same; the instruction is one
    fp32 operation where the emulation is a dozen float64 ones.
    """
    global _FMA_INSTALLED
    if _FMA_INSTALLED or simulator_enabled():
        return
    from ..arith.fp32 import fma_toward_zero

    overload_fp32_fma(fma_toward_zero, "fmaf_rz")
    _FMA_INSTALLED = True

"""Lane operations of the offset block step, one name for a scalar and for a vector of lanes.

Each function here is a stub that Numba types by ``@overload``: on 32-bit scalars (int32 or uint32 integers,
float32 numbers) by the scalar overload registered here, which is the plain arithmetic of one lane; on the
CPU's 512-bit vectors by the overload :mod:`mmaemu.cpu.simd` registers for the same stub (its LLVM vector
intrinsic of the same name). So a function of :mod:`mmaemu.arith` written with these names compiles on scalars
(the CUDA kernels, the CPU's scalar loops) and on vectors (the CPU's offset engine) from one source:
:mod:`mmaemu.arith.offset_step`.

The semantics are those of the vector operations (:mod:`mmaemu.cpu.simd`), lane by lane: integers are 32-bit
two's complement patterns (results int32, sums and products modulo 2**32, ``max_i32``/``min_i32`` signed,
``lshr_i32`` logical), ``max_f32(a, b)`` is ``a if a > b else b`` (the ordered comparison: of +0 and -0 the
second), ``abs_f32`` clears the sign bit, ``add_f32``/``sub_f32`` round to nearest and
``fma_toward_zero_f32`` is :func:`mmaemu.arith.fp32.fma_toward_zero` (on the GPU its ``fma.rz.f32``). A shift
amount is a constant. Called from plain Python (no compilation) a stub raises: the operations exist only for
compiled code; ``tests/test_offset_generic.py`` checks every scalar overload against its vector twin of
:mod:`mmaemu.cpu.simd`.
"""

import numpy as np
from numba import types
from numba.core.extending import overload

from .fp32 import float32_bits, float32_from_bits, fma_toward_zero


def _stub(name, doc):
    def stub(*args):
        raise TypeError(f"{name} is a lane operation for compiled code (mmaemu.arith.lanes)")

    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = doc
    return stub


add_i32 = _stub("add_i32", "Sum modulo 2**32.")
sub_i32 = _stub("sub_i32", "Difference modulo 2**32.")
mul_i32 = _stub("mul_i32", "Product modulo 2**32.")
and_i32 = _stub("and_i32", "Bit-wise and.")
or_i32 = _stub("or_i32", "Bit-wise or.")
xor_i32 = _stub("xor_i32", "Bit-wise exclusive or.")
andnot_i32 = _stub("andnot_i32", "``~a & b``.")
max_i32 = _stub("max_i32", "Signed maximum.")
min_i32 = _stub("min_i32", "Signed minimum.")
shl_i32 = _stub("shl_i32", "Left shift by a constant (0 ... 31).")
lshr_i32 = _stub("lshr_i32", "Logical right shift by a constant (0 ... 31).")
bits_of_f32 = _stub("bits_of_f32", "The int32 pattern of an fp32 number.")
f32_of_bits = _stub("f32_of_bits", "The fp32 number of an int32 pattern.")
add_f32 = _stub("add_f32", "fp32 sum rounded to nearest.")
sub_f32 = _stub("sub_f32", "fp32 difference rounded to nearest.")
max_f32 = _stub("max_f32", "``a if a > b else b`` (no NaN reaches it in mmaemu).")
abs_f32 = _stub("abs_f32", "The fp32 number with its sign bit cleared.")
fma_toward_zero_f32 = _stub("fma_toward_zero_f32", "``a * b + c`` rounded once toward zero.")


def _words(*args):
    """Whether every argument is a 32-bit integer scalar."""
    return all(isinstance(a, types.Integer) and a.bitwidth == 32 for a in args)


def _floats(*args):
    return all(a == types.float32 for a in args)


def _integer_binary(stub, impl):
    @overload(stub)
    def scalar(a, b):
        if _words(a, b):
            return impl


_integer_binary(add_i32, lambda a, b: np.int32(np.int64(a) + np.int64(b)))
_integer_binary(sub_i32, lambda a, b: np.int32(np.int64(a) - np.int64(b)))
_integer_binary(mul_i32, lambda a, b: np.int32(np.int64(a) * np.int64(b)))
_integer_binary(and_i32, lambda a, b: np.int32(np.int32(a) & np.int32(b)))
_integer_binary(or_i32, lambda a, b: np.int32(np.int32(a) | np.int32(b)))
_integer_binary(xor_i32, lambda a, b: np.int32(np.int32(a) ^ np.int32(b)))
_integer_binary(andnot_i32, lambda a, b: np.int32(~np.int32(a) & np.int32(b)))
_integer_binary(max_i32, lambda a, b: np.int32(a) if np.int32(a) > np.int32(b) else np.int32(b))
_integer_binary(min_i32, lambda a, b: np.int32(a) if np.int32(a) < np.int32(b) else np.int32(b))


@overload(shl_i32)
def _shl_scalar(a, amount):
    if _words(a) and isinstance(amount, types.Integer):
        return lambda a, amount: np.int32(np.int64(np.uint32(a)) << np.int64(amount))


@overload(lshr_i32)
def _lshr_scalar(a, amount):
    if _words(a) and isinstance(amount, types.Integer):
        return lambda a, amount: np.int32(np.uint32(a) >> np.uint32(amount))


@overload(bits_of_f32)
def _bits_scalar(x):
    if _floats(x):
        return lambda x: float32_bits(x)


@overload(f32_of_bits)
def _f32_scalar(x):
    if _words(x):
        return lambda x: float32_from_bits(np.int32(x))


@overload(add_f32)
def _add_f32_scalar(a, b):
    if _floats(a, b):
        return lambda a, b: np.float32(a + b)


@overload(sub_f32)
def _sub_f32_scalar(a, b):
    if _floats(a, b):
        return lambda a, b: np.float32(a - b)


@overload(max_f32)
def _max_f32_scalar(a, b):
    if _floats(a, b):
        return lambda a, b: max(b, a)  # Python's rule keeps the first of equals: b, as the vector's select


@overload(abs_f32)
def _abs_f32_scalar(x):
    if _floats(x):
        return lambda x: abs(x)


@overload(fma_toward_zero_f32)
def _fma_scalar(a, b, c):
    if _floats(a, b, c):
        return lambda a, b, c: fma_toward_zero(a, b, c)

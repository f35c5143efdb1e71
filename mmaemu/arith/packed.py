"""Packed integer primitives of the offset formulation (:mod:`.offset`): several small integers in one 32-bit word.

* :func:`dp4a` - ``c + sum_i a_i * b_i`` over the four unsigned bytes of a and b, modulo 2**32 (PTX
  ``dp4a.u32.u32``, SASS ``IDP4A``): four products' correction flags counted by one instruction.
* :func:`max_u16x2` - the maximum of each unsigned 16-bit half of a and b (PTX ``max.u16x2`` on sm_90 and newer):
  two outputs' exponent maxima by one instruction.
* :func:`add_u16x2` - the sum of each unsigned 16-bit half of a and b, modulo 2**16 (PTX ``add.u16x2`` on sm_90
  and newer). Followed by :func:`max_u16x2`, ptxas fuses the pair into one ``VIADDMNMX.U16x2`` on sm_90: two
  exponent sums and their running maxima per instruction.
* :func:`swap_halves` - the two 16-bit halves of a word exchanged (plain arithmetic: a rotation, one ``SHF``).
* :func:`load_words4` - four consecutive 32-bit elements of a row of a 2-D array (in kernels one 16-byte load,
  ``LDS.128`` from shared memory: the exponent pass reads a tile's words with it, which ptxas does not always
  vectorise by itself).

Each is an exact function of its integer arguments. CPUs and numba's CUDA simulator run the plain integer twins
here (:func:`dp4a_exact`, :func:`max_u16x2_exact`, :func:`add_u16x2_exact`); CUDA kernels get one PTX instruction
each, registered as ``target="cuda"`` overloads by :mod:`mmaemu.cuda.offset.ptx` (inline PTX: libdevice has none of
them). ``tests/test_offset.py`` checks the twins against Python integers.

Below sm_90 PTX has neither ``max.u16x2`` nor ``add.u16x2``; :mod:`mmaemu.cuda.offset.ptx` then emits

* ``max.f16x2``, which equals :func:`max_u16x2_exact` whenever both halves of both words are bit patterns of
  positive normal fp16 numbers (0x0400 to 0x7BFF: positive finite fp16 numbers are ordered as their patterns, and
  normal ones are never flushed); :func:`max_f16x2_model` is that instruction modelled on the CPU (numpy's
  float16);
* ``add.u32``, which equals :func:`add_u16x2_exact` whenever the low halves' sum is below 2**16 (no carry into the
  high half; a carry out of the high half falls off the top in both); :func:`add_u32_model` models it.

Both conditions are tested on both sides; the offset formulation keeps every exponent word inside them
(:mod:`.offset`, condition 6).
"""

import numpy as np
from numba import types
from numba.core.extending import overload

from ..base._jit import arithmetic

BYTE_ONES = 0x01010101  # dp4a's b for "sum of the four bytes of a"
F16_NORMAL_MIN = 0x0400  # the domain of max.f16x2 as an unsigned maximum: [F16_NORMAL_MIN, F16_NORMAL_MAX]
F16_NORMAL_MAX = 0x7BFF


@arithmetic
def dp4a_exact(a, b, c):
    """``c + sum of a_i * b_i`` over the four unsigned bytes of a and b, modulo 2**32."""
    total = np.uint32(c)
    for i in range(4):
        shift = np.uint32(8 * i)
        x = (np.uint32(a) >> shift) & np.uint32(0xFF)
        y = (np.uint32(b) >> shift) & np.uint32(0xFF)
        total = np.uint32(total + np.uint32(x * y))
    return total


@arithmetic
def max_u16x2_exact(a, b):
    """The larger of the low halves and of the high halves of the uint32 words a and b, packed."""
    lo = max(np.uint32(a) & np.uint32(0xFFFF), np.uint32(b) & np.uint32(0xFFFF))
    hi = max(np.uint32(a) >> np.uint32(16), np.uint32(b) >> np.uint32(16))
    return np.uint32((hi << np.uint32(16)) | lo)


@arithmetic
def add_u16x2_exact(a, b):
    """The sums of the low halves and of the high halves of the uint32 words a and b, each modulo 2**16, packed."""
    lo = ((np.uint32(a) & np.uint32(0xFFFF)) + (np.uint32(b) & np.uint32(0xFFFF))) & np.uint32(0xFFFF)
    hi = ((np.uint32(a) >> np.uint32(16)) + (np.uint32(b) >> np.uint32(16))) & np.uint32(0xFFFF)
    return np.uint32((hi << np.uint32(16)) | lo)


@arithmetic
def swap_halves(x):
    """The uint32 x with its 16-bit halves exchanged (a rotation by 16 bits)."""
    return np.uint32((np.uint32(x) >> np.uint32(16)) | (np.uint32(x) << np.uint32(16)))


def max_f16x2_model(a, b):
    """PTX ``max.f16x2`` of two words on the CPU (numpy float16, IEEE maxNum of each half), as bit patterns."""
    x = np.array([a], np.uint32).view(np.float16)
    y = np.array([b], np.uint32).view(np.float16)
    return int(np.fmax(x, y).view(np.uint32)[0])


def add_u32_model(a, b):
    """PTX ``add.u32`` of two words (the stand-in for ``add.u16x2`` below sm_90), modulo 2**32."""
    return (int(a) + int(b)) % 2**32


def load_words4(array, row, column):
    """``array[row, column:column + 4]`` as a tuple (a C-contiguous 2-D array of 32-bit numbers; in kernels the
    address must be a multiple of 16 bytes: ``column`` and the row length multiples of 4)."""
    return array[row, column], array[row, column + 1], array[row, column + 2], array[row, column + 3]


def dp4a(a, b, c):
    """uint32 ``c + sum_i byte_i(a) * byte_i(b)`` (modulo 2**32)."""
    return dp4a_exact(a, b, c)


def max_u16x2(a, b):
    """uint32 word of the per-half unsigned maxima of a and b."""
    return max_u16x2_exact(a, b)


def add_u16x2(a, b):
    """uint32 word of the per-half sums of a and b, modulo 2**16."""
    return add_u16x2_exact(a, b)


_CALLERS = {1: lambda f: lambda a: f(a), 2: lambda f: lambda a, b: f(a, b), 3: lambda f: lambda a, b, c: f(a, b, c)}


def overload_on_words(function, implementation, target):
    """Register ``implementation`` (a jitted function or an intrinsic with ``function``'s arguments) as
    ``function`` for integer arguments on a numba target: ``"generic"`` (CPU loops and the simulator run the exact
    twins) or ``"cuda"`` (kernels run the instruction, :mod:`mmaemu.cuda.offset.ptx`)."""
    call = _CALLERS[function.__code__.co_argcount](implementation)

    @overload(function, target=target, strict=False)
    def _on_words(*args):
        return call if all(isinstance(arg, types.Integer) for arg in args) else None


@overload(load_words4, target="generic")
def _load_words4_generic(array, row, column):
    if not (isinstance(array, types.Array) and array.ndim == 2 and isinstance(row, types.Integer)
            and isinstance(column, types.Integer)):
        return None
    return lambda array, row, column: (array[row, column], array[row, column + 1], array[row, column + 2],
                                       array[row, column + 3])


overload_on_words(dp4a, dp4a_exact, "generic")
overload_on_words(max_u16x2, max_u16x2_exact, "generic")
overload_on_words(add_u16x2, add_u16x2_exact, "generic")
